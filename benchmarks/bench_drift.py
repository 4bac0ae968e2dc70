"""Drift detection: false alarms under the null and delay after a clean prefix, both detectors.

The product e-process (:class:`witcert_calculus.EProcess`, Ville: probability of any false
alarm <= delta) and the e-detector (:class:`witcert_calculus.EDetector`, e-CUSUM: average
run length under the null >= 1/alpha) read the same Hoeffding factors (kappa = 0.5, C = 1)
of Bernoulli observations whose certified mean is 0.5. Printed, from one run:

- under the null (mean exactly 0.5, the adversarial boundary), over ``--streams`` streams of
  ``--horizon`` steps: the share of streams with a false alarm and the mean run length
  (censored at the horizon, so a lower bound);
- after a drift to 0.8 following 0, 1,000 and 10,000 clean steps: the median delay.

Run: ``.venv/bin/python benchmarks/bench_drift.py [--streams N] [--horizon T]``
"""

from __future__ import annotations

import argparse

import numpy as np

from witcert_calculus import EDetector, EProcess
from witcert_calculus.drift.changepoint import run_lengths
from witcert_calculus.drift.eprocess import log_paths

NULL, DRIFT = 0.5, 0.8


def _draw(rng: np.random.Generator, p: float, shape: tuple[int, ...]) -> np.ndarray:
    return (rng.random(shape) < p).astype(np.float64)


def null_table(streams: int, horizon: int, level: float) -> None:
    rng = np.random.default_rng(0)
    w = _draw(rng, NULL, (streams, horizon))
    det = run_lengths(w, m=NULL, c=1.0, alpha=level)
    paths = log_paths(w, NULL, 1.0)
    prod = (paths >= EProcess(delta=level).threshold).any(axis=1)
    censored = np.where(det == 0, horizon, det)
    print(f"null (mean {NULL}), {streams} streams x {horizon} steps, level {level}:")
    print(f"  e-process  false-alarm share {prod.mean():.4f}  (guarantee: <= {level})")
    print(f"  e-detector false-alarm share {(det > 0).mean():.4f}; mean run length >= "
          f"{censored.mean():.0f} (guarantee: >= {1 / level:.0f})")


def delay_table(streams: int, level: float) -> None:
    print(f"drift {NULL} -> {DRIFT}, level {level}, median delay over {streams} streams:")
    print("  clean prefix   e-detector   e-process")
    for prefix in (0, 1_000, 10_000):
        rng = np.random.default_rng(prefix + 1)
        clean = _draw(rng, NULL, (streams, prefix))
        drift = _draw(rng, DRIFT, (streams, 150_000))
        det = []
        for row_c, row_d in zip(clean, drift, strict=True):
            d = EDetector(alpha=level)
            d.observe_many(row_c, m=NULL, c=1.0)
            d.observe_many(row_d[:5000], m=NULL, c=1.0)
            det.append((d.alarm_step or 0) - prefix)
        paths = log_paths(np.concatenate([clean, drift], axis=1), NULL, 1.0)[:, prefix:]
        hit = paths >= EProcess(delta=level).threshold
        prod = np.where(hit.any(axis=1), hit.argmax(axis=1) + 1, -1)
        print(f"  {prefix:>12,}   {np.median(det):>10.0f}   {np.median(prod):>9.0f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--streams", type=int, default=400)
    ap.add_argument("--horizon", type=int, default=5000)
    args = ap.parse_args()
    null_table(args.streams, args.horizon, 0.01)
    delay_table(min(args.streams, 40), 1e-6)


if __name__ == "__main__":
    main()
