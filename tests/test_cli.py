"""The ``witcert`` command line: every command answers ``--help``, prints what the library
computes, and exits 2 with a message naming the bad value."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest

from witcert_adapters.cli import main
from witcert_calculus import Aggregate, tradeoff_curve
from witcert_calculus.explore.chain_spec import load_chain_spec
from witcert_calculus.explore.entry_trace import read_entry_trace, write_entry_trace
from witcert_calculus.explore.gate_laws import gate_threshold
from witcert_calculus.meters.sentinels import rate_upper_bound_exact

ROOT = Path(__file__).resolve().parents[1]


def test_the_console_script_is_declared_and_installed() -> None:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert meta["project"]["scripts"]["witcert"] == "witcert_adapters.cli:main"
    exe = Path(sys.executable).parent / "witcert"
    assert exe.exists(), "reinstall the package (bash scripts/setup.sh)"
    proc = subprocess.run([str(exe), "gate-law", "--tau", "0.2", "--form", "eform"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "0.1682361" in proc.stdout


@pytest.mark.parametrize("command", [[], ["gate-law"], ["rate"], ["explain"], ["ledger"],
                                     ["ledger", "replay"], ["formal"], ["formal", "check"]])
def test_every_command_has_help(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([*command, "--help"])
    assert exit_.value.code == 0
    assert "usage: witcert" in capsys.readouterr().out


def test_gate_law_prints_the_library_threshold(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["gate-law", "--tau", "0.2", "--form", "osc", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["threshold"] == gate_threshold(0.2, form="osc")
    assert out["bound_at_threshold"] <= 0.2
    assert main(["gate-law", "--tau", "1.5", "--form", "tanh", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["admits_every_witness"] is True


def test_rate_prints_both_bounds(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rate", "--trials", "144", "--delta", "0.05", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["exact"] == rate_upper_bound_exact(144, 0.05)
    assert out["exact"] < out["exponential"]


@pytest.mark.parametrize("argv, word", [
    (["gate-law", "--tau", "-1", "--form", "eform"], "tau"),
    (["gate-law", "--tau", "0.2", "--form", "affine"], "eps0"),
    (["rate", "--trials", "0", "--delta", "0.05"], "trials"),
    (["rate", "--trials", "10", "--delta", "1.5"], "delta"),
])
def test_bad_values_exit_2_naming_the_value(argv: list[str], word: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert word in capsys.readouterr().err


def test_an_unknown_form_is_refused_by_the_parser(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["gate-law", "--tau", "0.2", "--form", "cubic"])
    assert exit_.value.code == 2
    assert "cubic" in capsys.readouterr().err


def test_demo_hands_its_arguments_to_the_demo(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["demo", "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "--threshold" in out and "--repair" in out


SPEC = ("witness(witness_max=0.02) >> score(scale=0.125, q_norm_max=12) >> eform"
        " >> selection(m_out=0.004, m_in=0.002)")


def test_explain_prints_stages_theorem_statements_and_tier(
        capsys: pytest.CaptureFixture[str]) -> None:
    from witcert_calculus.lean.theorems import lookup

    assert main(["explain", SPEC]) == 0
    out = capsys.readouterr().out
    assert load_chain_spec(SPEC).explain() in out
    for name in ("WitCert.Semantic.witness_contract_sound",
                 "WitCert.Semantic.softmax_tv_eform_contract_sound"):
        rec = lookup(name)
        assert rec.axioms is not None and rec.axioms_scope in {"project", "complete"}
        assert set(rec.axioms) <= {"propext", "Classical.choice", "Quot.sound"}
        assert f"{name}:\n    {rec.statement}\n    {rec.describe_axioms()}\n" in out
        assert rec.describe_axioms().startswith("axioms: " + (", ".join(rec.axioms) or "none"))
    assert out.rstrip().endswith("tier CERTIFIED")
    assert main(["explain", SPEC, "--json"]) == 0
    cited = [t for s in json.loads(capsys.readouterr().out)["stages"] for t in s["theorems"]]
    assert cited and all(t["axioms"] == list(lookup(t["name"]).axioms or ())
                         and t["axioms_text"] == lookup(t["name"]).describe_axioms()
                         for t in cited)


@pytest.mark.parametrize("suffix", [".json", ".toml"])
def test_explain_reads_json_and_toml_specs(suffix: str, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    stages = [{"bridge": "score", "scale": 0.125, "q_norm_max": 12}, {"bridge": "affine",
                                                                     "eps0": 0.05}]
    path = tmp_path / f"chain{suffix}"
    if suffix == ".json":
        path.write_text(json.dumps({"site": "write", "stages": stages}))
    else:
        path.write_text('site = "write"\n' + "".join(
            "[[stages]]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in st.items())
            for st in stages))
    assert main(["explain", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["tier"] == "PARTIALLY_CERTIFIED" and out["cap"] is not None
    assert [s["name"] for s in out["stages"]] == ["score bridge", "softmax->TV (affine)"]
    assert [s["tier"] for s in out["stages"]] == ["CERTIFIED", "PARTIALLY_CERTIFIED"]
    assert "AtWrite" in out["explain"]


@pytest.mark.parametrize(("spec", "word"), [
    ("", "empty"), ("nope", "names no bridge 'nope'"), ("score(1, 2)", "keyword arguments"),
    ("score(scale=0.125)", "missing ['q_norm_max']"), ("eform(k=1)", "unknown ['k']"),
    ("score(scale=-1, q_norm_max=2)", "scale=-1"), ("eform >>", "stage 2"),
    ("ratio(m_in=Nope, m_out=AttentionTV, ratio=1, samples=1, statistic='p', set_type='s')",
     "m_in='Nope' is not a registered metric"),
    ("witness(witness_max=0.02) >> selection(m_out=0.1, m_in=0.1)", "insert a bridge"),
    ("missing.json", "cannot be read"),
])
def test_explain_names_what_is_wrong_with_a_spec(spec: str, word: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", spec]) == 2
    assert word in capsys.readouterr().err


def test_explain_refuses_a_bad_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for text, word in (("{", "not valid JSON"), ('{"stages": []}', "non-empty list"),
                       ('{"stages": [{"bridge": "eform"}], "extra": 1}', "unknown keys"),
                       ('{"site": "there", "stages": [{"bridge": "eform"}]}', "site='there'")):
        (tmp_path / "c.json").write_text(text)
        assert main(["explain", str(tmp_path / "c.json")]) == 2
        assert word in capsys.readouterr().err
    (tmp_path / "c.json").write_text('{"site": "write", "stages": [{"bridge": "eform"}]}')
    assert main(["explain", str(tmp_path / "c.json"), "--site", "consume"]) == 2
    assert "site='consume' was given" in capsys.readouterr().err


def _trace(path: Path) -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    steps = [rng.uniform(0, 1, size=12) ** 3 for _ in range(9)]
    write_entry_trace(path, steps, labels=[("r/1", k) for k in range(9)], metric="AttentionTV",
                      aggregate=Aggregate.MAX, saturation=1.0)
    return steps


def test_ledger_replay_prints_the_library_curve_and_writes_a_plot(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    steps = _trace(tmp_path / "t.jsonl")
    assert main(["ledger", "replay", str(tmp_path / "t.jsonl"), "--points", "5", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    top = max(float(s.max()) for s in steps)
    want = tradeoff_curve(steps, thresholds=np.linspace(0, top, 5), aggregate=Aggregate.MAX,
                          saturation=1.0)
    assert out["retained_fraction"] == want.retained_fraction.tolist()
    assert out["worst_step_bound"] == want.worst_step_bound.tolist()
    assert out["retained_fraction"][-1] == 1.0 and out["steps"] == 9
    assert (tmp_path / "t.tradeoff.png").read_bytes()[:4] == b"\x89PNG"
    assert main(["ledger", "replay", str(tmp_path / "t.jsonl"), "--plot",
                 str(tmp_path / "p.png")]) == 0
    text = capsys.readouterr().out
    assert "9 steps, 108 entries" in text and (tmp_path / "p.png").exists()
    assert main(["ledger", "replay", str(tmp_path / "t.jsonl"), "--points", "1"]) == 2
    assert "points=1 is invalid" in capsys.readouterr().err


def test_a_trace_round_trips(tmp_path: Path) -> None:
    steps = _trace(tmp_path / "t.jsonl")
    back = read_entry_trace(tmp_path / "t.jsonl")
    assert back.aggregate is Aggregate.MAX and back.saturation == 1.0
    assert all(np.array_equal(a, b) for a, b in zip(steps, back.steps, strict=True))
    assert back.labels[3] == ("r/1", 3)


@pytest.mark.parametrize(("line", "word"), [
    ('{"request": "r", "step": 0, "bounds": [0.1, -1]}', ":2: bounds"),
    ('{"request": "r", "step": 0, "bounds": [0.1, NaN]}', ":2: bounds"),
    ('{"request": "r", "bounds": [0.1]}', "must hold `request`"),
    ("not json", "is not a JSON line"),
])
def test_ledger_replay_names_the_bad_line(line: str, word: str, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    _trace(tmp_path / "t.jsonl")
    head = (tmp_path / "t.jsonl").read_text().splitlines()[0]
    (tmp_path / "bad.jsonl").write_text(head + "\n" + line + "\n")
    assert main(["ledger", "replay", str(tmp_path / "bad.jsonl")]) == 2
    assert word in capsys.readouterr().err
    (tmp_path / "bad.jsonl").write_text('{"format": "other"}\n')
    assert main(["ledger", "replay", str(tmp_path / "bad.jsonl")]) == 2
    assert "header" in capsys.readouterr().err


def _checkout(tmp_path: Path) -> Path:
    import shutil

    root = tmp_path / "checkout"
    for part in ("scripts", "formal", "witcert_calculus"):
        shutil.copytree(ROOT / part, root / part, ignore=shutil.ignore_patterns(
            "build", "__pycache__", ".lake"))
    (root / "formal" / "build").mkdir()
    # The export a Lean build writes has the shipped export's format.
    shutil.copy(ROOT / "witcert_calculus" / "lean" / "lean_export.json",
                root / "formal" / "build" / "theorems.json")
    return root


def test_formal_check_cross_checks_the_export(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    root = _checkout(tmp_path)
    assert main(["formal", "check", "--no-build", "--root", str(root)]) == 0
    out = capsys.readouterr().out
    assert "sync check" in out and "witcert formal check: ok" in out
    export = root / "formal" / "build" / "theorems.json"
    doc = json.loads(export.read_text())
    cited = "WitCert.Semantic.witness_contract_sound"
    # a theorem the library cites, dropped from the export
    export.write_text(json.dumps({**doc, "theorems": [t for t in doc["theorems"]
                                                       if t["name"] != cited]}))
    assert main(["formal", "check", "--no-build", "--root", str(root)]) == 2
    assert cited in capsys.readouterr().err
    # a statement changed: the fresh export no longer proves what the library ships
    changed = [dict(t, statement="True") if t["name"] == cited else t for t in doc["theorems"]]
    export.write_text(json.dumps({**doc, "theorems": changed}))
    assert main(["formal", "check", "--no-build", "--root", str(root)]) == 2
    assert cited in capsys.readouterr().err
    # a drifted generated check fails the sync half
    export.write_text(json.dumps(doc))
    gen = root / "formal" / "WitCert" / "GeneratedChecks.lean"
    gen.write_text(gen.read_text() + "\n-- drift\n")
    assert main(["formal", "check", "--no-build", "--root", str(root)]) == 2
    assert "sync check failed" in capsys.readouterr().err


def test_formal_check_needs_a_checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["formal", "check", "--no-build"]) == 2
    assert "no witcert-calculus checkout" in capsys.readouterr().err
