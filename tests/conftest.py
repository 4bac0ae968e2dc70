"""Shared test configuration: hypothesis profile for CI-sized runs."""

from __future__ import annotations

from hypothesis import HealthCheck, settings

settings.register_profile(
    "witcert", deadline=None, max_examples=200,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("witcert")
