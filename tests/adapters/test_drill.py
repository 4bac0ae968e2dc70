"""The verdict store across engine deaths, and the plugin under load and ``kill -9``.

The store tests kill real processes (``SIGKILL``) that hold real SQLite files and real
``flock`` locks; the drill starts vLLM's server twice on one store.
"""

from __future__ import annotations

import os
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest

from witcert_adapters.vllm_plugin.store import VerdictStore, track
from witcert_adapters.vllm_plugin.verdicts import Accounts, recount_spent
from witcert_calculus.errors import InvalidValueError

_ENGINE = """
import os, sys
from fractions import Fraction
from witcert_adapters.vllm_plugin.store import VerdictStore, track
from witcert_adapters.vllm_plugin.verdicts import Accounts
store = VerdictStore(sys.argv[1])
acc = Accounts(layers=2, seats=4, tau=0.1, audit=False, delta_req=Fraction(1, 100),
               session=sys.argv[2], kv_cache_dtype="fp8_e4m3", form="meter", witness="format")
track(store, acc)
for rid in sys.argv[3:]:
    acc.tally(rid)
store.put(acc.finish(sys.argv[3]))  # the first request finishes; the others are in flight
print("ready", flush=True)
if sys.argv[2].startswith("dead"):
    os.kill(os.getpid(), 9)
sys.stdin.read()  # a live engine: serving until its stdin closes
"""


def _engine(store: Path, session: str, *requests: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", _ENGINE, str(store), session, *requests],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if session.startswith("dead"):
        proc.wait()
        assert proc.returncode == -9
        assert proc.stdin is not None
        proc.stdin.close()
        proc.stdout.close()
    else:
        assert line.strip() == "ready"
    return proc


def _accounts(session: str) -> Accounts:
    return Accounts(layers=2, seats=4, tau=0.1, audit=False, delta_req=Fraction(1, 100),
                    session=session, kv_cache_dtype="fp8_e4m3", form="meter",
                    witness="format")


def test_requests_of_a_killed_engine_are_cut_and_a_live_engines_are_not(tmp_path: Path) -> None:
    file = tmp_path / "v.sqlite"
    _engine(file, "dead-1", "a-0-aaaaaaaa", "b-0-bbbbbbbb", "c-0-cccccccc")
    store = VerdictStore(file)
    cut = store.recover()
    # the killed engine's two requests in flight, not its finished one
    assert sorted(v.request for v in cut) == ["b-0-bbbbbbbb", "c-0-cccccccc"]
    live = _engine(file, "live-1", "d-0-dddddddd", "e-0-eeeeeeee")
    assert store.recover() == []  # the live engine's requests are not cut
    for v in cut:
        assert v.tier is None and v.session == "dead-1"
        assert v.failure is not None and v.failure.startswith("cut: engine session dead-1")
        assert Fraction(v.spent) == Fraction(1, 100) == recount_spent(v.to_json())
        assert v.gate["accepted"] is False
    tiers = {v.request: v.tier for v in store.all()}
    assert tiers["a-0-aaaaaaaa"] is not None and tiers["d-0-dddddddd"] is not None
    assert "e-0-eeeeeeee" not in tiers  # alive: still being served, no verdict yet
    assert store.recover() == []  # the dead session is ended once
    assert [t.tier for t in store.totals() if t.tier == "FAILED"] == ["FAILED"]
    assert store.find("b-0") and store.find("b-0")[0].tier is None  # the client's id finds it
    # the live engine ends (its process exits) with a request still open: cut on next open
    assert live.stdin is not None
    live.stdin.close()
    live.wait()
    assert live.stdout is not None
    live.stdout.close()
    assert [v.request for v in store.recover()] == ["e-0-eeeeeeee"]
    acc = _accounts("restart-1")
    track(store, acc)
    acc.tally("f-0-ffffffff")  # the new session records its requests as their accounts open
    other = VerdictStore(file)
    assert other.recover() == []  # this process holds restart-1's lock: alive
    store.close()
    assert [v.request for v in other.recover()] == ["f-0-ffffffff"]  # lock released: cut
    other.close()


def test_bad_sessions_are_named(tmp_path: Path) -> None:
    store = VerdictStore(tmp_path / "v.sqlite")
    with pytest.raises(InvalidValueError, match="witness"):
        store.open_session("s", {"kv_cache_dtype": "fp8", "form": "meter", "tau": "0.1",
                                 "delta_req": "1/100"})
    track(store, _accounts("s1"))
    with pytest.raises(InvalidValueError, match="already holds one"):
        track(store, _accounts("s2"))
    again = VerdictStore(tmp_path / "v.sqlite")
    with pytest.raises(InvalidValueError, match="s1"):
        track(again, _accounts("s1"))  # a session id is used once
    assert os.path.exists(tmp_path / "v.sqlite.session-s1.lock")
    again.close()
    store.close()


@pytest.mark.slow
@pytest.mark.engine
def test_the_plugin_under_load_and_kill_9(tmp_path: Path) -> None:
    """32 concurrent audited completions recounted from what the client saw; the server
    killed with SIGKILL mid-generation and restarted on the same store."""
    from witcert_adapters.demo.models import smollm2_engine_dir
    from witcert_adapters.vllm_plugin.drill import drill

    report = drill(model=smollm2_engine_dir(), folder=tmp_path)
    assert report.problems == [], report.text()
    assert report.verdicts == 32 and report.misattributed == 0 and report.violations == 0
    assert report.audited == report.cells > 0 and report.spend_mismatches == 0
    assert report.killed_after_tokens >= 8  # every stream was mid-generation
    assert report.integrity == "ok" and report.acknowledged_kept == 32
    assert report.cut == report.cut_failed_closed == 8
    assert report.certified_after_restart
