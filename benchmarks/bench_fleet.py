"""Throughput of the fleet (several gloo ranks, one account per request) next to one ledger.

A synthetic trace of entry events (per-entry bounds, exponential with mean 0.03, a few
above the threshold 0.1; every fourth step probabilistic) is replayed twice in one run:

- by one :class:`~witcert_calculus.ledger.RiskLedger` in this process, each step of each
  request admitted as one batch of all its entries;
- by ``--ranks`` processes of :class:`~witcert_adapters.fleet.FleetLedger` on 127.0.0.1
  (gloo), each admitting its shard of every request's entries and reducing once per step
  for all requests (one collective, an ``all_gather`` of every rank's per-request rows).

Both replay the same bounds (rank ``r``'s shard of step ``t`` is drawn from one seeded
generator, and the single ledger concatenates the shards). Only the ledger calls are
timed (generating the trace is not). The fleet's time is the slowest rank's; the
all-reduce share is the time inside the step's collective (waiting for the other ranks
included) over the rank's time in ``FleetLedger.step``, averaged over the ranks. The final verdicts of both are compared
(tier, exact spend, entries kept) and the agreement printed.

Run: ``.venv/bin/python benchmarks/bench_fleet.py [--events N] [--ranks R]
[--requests Q] [--entries E]`` (defaults: 10^7 events, 4 ranks, 64 requests, 1024 entries
per request, rank and step).
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import socket
import time
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as tmp

from witcert_adapters.fleet import FleetLedger
from witcert_adapters.head_shards import HeadShard
from witcert_calculus.accounting.entries import Aggregate
from witcert_calculus.ledger import RiskLedger
from witcert_calculus.metrics import AtConsume, AttentionTV
from witcert_calculus.tiers import _proof  # pyright: ignore[reportPrivateUsage]

TV = AttentionTV[AtConsume]
# A meter's proof, as the meter issues it (the benchmark times the ledger, not a meter).
PROOF = _proof("WitCert.Meters.tv_eform_sound")
TAU = 0.1
DELTA = "1/100"


def shard(seed: int, step: int, rank: int, requests: int, entries: int) -> torch.Tensor:
    """Rank ``rank``'s bounds of step ``step``: ``[requests, entries]`` float64."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step * 4_099 + rank)
    u = torch.rand((requests, entries), generator=g, dtype=torch.float64)
    return -0.03 * torch.log1p(-u)


def probabilistic(step: int) -> bool:
    return step % 4 == 3


def _rank(rank: int, world: int, port: int, steps: int, requests: int, entries: int,
          seed: int, queue: Any) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=120))
    heads = world * 8
    fleet = FleetLedger(HeadShard.even(rank=rank, world=world, total=heads))
    ids = list(range(1, requests + 1))
    for r in ids:
        fleet.open_request(r, delta_req=DELTA)
    dist.barrier()
    in_step = 0.0
    for t in range(steps):
        b = shard(seed, t, rank, requests, entries)
        t0 = time.perf_counter()
        fleet.step(ids, b, threshold=TAU, metric=TV, evidence=PROOF,
                   probabilistic=probabilistic(t))
        in_step += time.perf_counter() - t0
    finals = [fleet.close_request(r) for r in ids]
    queue.put((rank, in_step, fleet.reduce_seconds,
               [(v.tier, v.spent, v.verdict.entries_kept) for v in finals]))
    dist.barrier()
    dist.destroy_process_group()


def _single(steps: int, world: int, requests: int, entries: int,
            seed: int) -> tuple[float, list[Any]]:
    led = RiskLedger()
    ids = [led.open_request(delta_req=DELTA) for _ in range(requests)]
    spent = 0.0
    for t in range(steps):
        full = torch.cat([shard(seed, t, r, requests, entries) for r in range(world)],
                         dim=1).numpy()
        t0 = time.perf_counter()
        for j, r in enumerate(ids):
            delta = led.next_allowance(r) if probabilistic(t) else 0
            led.admit_entries(r, full[j], threshold=TAU, metric=TV, evidence=PROOF,
                              delta=delta, aggregate=Aggregate.MAX)
        spent += time.perf_counter() - t0
    finals = [led.close_request(r) for r in ids]
    return spent, [(v.tier, v.spent, v.entries_kept) for v in finals]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main(argv: list[str] | None = None) -> None:
    """Replay the trace through one ledger and through the fleet; print both throughputs."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=10_000_000)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--entries", type=int, default=1024,
                    help="entries per request, rank and step")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    for name in ("events", "ranks", "requests", "entries"):
        if getattr(a, name) < 1:
            ap.error(f"--{name} must be >= 1")
    torch.set_num_threads(1)
    per_step = a.requests * a.ranks * a.entries
    steps = math.ceil(a.events / per_step)
    events = steps * per_step
    print(f"trace: {events} entry events = {steps} steps x {a.requests} requests x "
          f"{a.ranks} ranks x {a.entries} entries (cpu cores: {os.cpu_count()})")

    single_s, single = _single(steps, a.ranks, a.requests, a.entries, a.seed)

    ctx = tmp.get_context("spawn")
    queue = ctx.Queue()
    port = _port()
    procs = [ctx.Process(target=_rank, args=(r, a.ranks, port, steps, a.requests, a.entries,
                                             a.seed, queue)) for r in range(a.ranks)]
    for p in procs:
        p.start()
    got = [queue.get(timeout=3600) for _ in procs]
    for p in procs:
        p.join()
    if any(p.exitcode != 0 for p in procs):
        raise SystemExit(f"a rank failed: exit codes {[p.exitcode for p in procs]}")
    got.sort(key=lambda x: x[0])
    fleet_s = max(g[1] for g in got)
    share = sum(g[2] / g[1] for g in got) / len(got)
    agree = all(g[3] == single for g in got)
    print(f"single-process ledger: {single_s:.2f} s, {events / single_s:.3e} events/s")
    print(f"fleet of {a.ranks} ranks: {fleet_s:.2f} s (slowest rank), "
          f"{events / fleet_s:.3e} events/s")
    print(f"fleet / single-process throughput: {single_s / fleet_s:.2f}")
    print(f"all-reduce share of the fleet's step time: {share:.3f} "
          f"({steps} step reductions per rank, one all_gather each)")
    print(f"verdicts agree (tier, exact spend, entries kept, all {a.requests} requests): "
          f"{'yes' if agree else 'NO'}")


if __name__ == "__main__":
    main()
