"""The modelling steps between the Lean theorems and the code: listed once, shown with every
bound that rests on them, and in step with ``formal/README.md``."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from witcert_calculus import AtConsume, Tier, softmax_tv_eform
from witcert_calculus.errors import InvalidValueError
from witcert_calculus.lean.modelling import (
    FLOAT_ROUNDING,
    HIGH_PRECISION,
    SENTINEL_DRAWS,
    SOFTMAX_AS_COMPUTED,
    STEPS,
    ZERO_MASS_TOKENS,
    Discharge,
    ModellingStep,
    modelling_of,
    steps_for,
)
from witcert_calculus.lean.theorems import TV_EFORM_METER_SOUND, cited_theorems, lookup
from witcert_calculus.meters.tv_forms import tv_eform
from witcert_calculus.meters.witness import RopeLayout, logit_bound
from reference.issued import proof, reading

ROOT = Path(__file__).resolve().parents[1]
ALL_STEPS = tuple(dict.fromkeys(s for steps in STEPS.values() for s in steps))


def _readme_section() -> str:
    text = (ROOT / "formal" / "README.md").read_text(encoding="utf-8")
    m = re.search(r"^## Modelling assumptions outside Lean\n(.*?)(?=^## |\Z)", text,
                  re.MULTILINE | re.DOTALL)
    assert m, "formal/README.md has no 'Modelling assumptions outside Lean' section"
    return m.group(1)


def test_every_theorem_with_steps_is_cited_and_exported() -> None:
    for theorem in STEPS:
        assert theorem in cited_theorems(), theorem
        lookup(theorem)


def test_every_proved_step_names_an_exported_theorem() -> None:
    proved = [s for s in ALL_STEPS if s.discharge is Discharge.PROVED]
    assert SENTINEL_DRAWS in proved
    for s in proved:
        name = s.by.split()[0]
        assert lookup(name).name == name, s


def test_formal_readme_states_every_step_by_key() -> None:
    section = _readme_section()
    for s in ALL_STEPS:
        assert f"`{s.key}`" in section, f"formal/README.md does not state {s.key}"
        assert s.discharge.value.split()[0] in section


def test_a_bridge_contract_explains_its_modelling() -> None:
    c = softmax_tv_eform(AtConsume)
    assert HIGH_PRECISION in c.modelling
    text = c.explain()
    assert "modelled outside Lean:" in text
    assert "high-precision: checked by code on every call" in text


def test_a_tv_reading_lists_the_steps_it_rests_on_without_changing_its_tier() -> None:
    p = np.array([0.5, 0.25, 0.25])
    c = logit_bound(np.array([1.0, 0.0, 0.5, 0.5]), np.full((3, 2), 0.01), scale=1.0,
                    layout=RopeLayout.INTERLEAVED)
    reading = tv_eform(p, c).reading()
    keys = [s.key for s in reading.modelling]
    assert keys[:3] == [FLOAT_ROUNDING.key, SOFTMAX_AS_COMPUTED.key, ZERO_MASS_TOKENS.key]
    assert any(s.discharge is Discharge.ASSUMED for s in reading.modelling)
    assert reading.tier is Tier.CERTIFIED  # the model's steps are stated, not tier-limiting
    assert reading.assumptions == ()


def test_steps_of_evidence_follow_the_cited_theorems() -> None:
    from witcert_calculus.tiers import Composition, Proof

    e = Composition((proof(TV_EFORM_METER_SOUND), proof("WitCert.Contract.comp_sound")))
    assert modelling_of(e) == steps_for(TV_EFORM_METER_SOUND)
    assert steps_for("WitCert.Contract.comp_sound") == ()


@pytest.mark.parametrize("kwargs, name", [
    ({"key": " "}, "key"),
    ({"statement": ""}, "statement"),
    ({"by": ""}, "by"),
    ({"discharge": "proved"}, "discharge"),
])
def test_a_malformed_step_is_a_typed_error(kwargs: dict[str, object], name: str) -> None:
    args: dict[str, object] = {"key": "k", "statement": "s", "discharge": Discharge.CHECKED,
                               "by": "b"}
    args.update(kwargs)
    with pytest.raises(InvalidValueError, match=name):
        ModellingStep(**args)  # type: ignore[arg-type]
