"""Kernel tests: one CPU thread (two threads on two shared cores are many times slower)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

torch.set_num_threads(1)
