"""The ``witcert`` command line: every command answers ``--help``, prints what the library
computes, and exits 2 with a message naming the bad value."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from witcert_adapters.cli import main
from witcert_calculus.gate_laws import gate_threshold
from witcert_calculus.sentinels import rate_upper_bound_exact

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


@pytest.mark.parametrize("command", [[], ["gate-law"], ["rate"]])
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
