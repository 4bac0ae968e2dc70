"""The shadow audit: the served run's end-to-end divergence, replayed exactly on a sample.

For every request the sampler decides, before the request is served and from the request id
and the operator's seed alone, whether it is audited (:class:`ShadowSampler`: no adaptive
selection). The served run generates greedily reading its compressed memory (every layer, the
current token's entries included; the prefill attends exactly, as engines do, and writes the
compressed cache). For an audited request the exact model is replayed on the served tokens
(teacher-forced, one forward): at every generated step the true next-token TV and
``KL(exact || served)`` between the two distributions over the same prefix. A request
*exceeds* when its largest step TV is above the threshold; the outcomes feed a
:class:`~witcert_calculus.accounting.rate.RateBound`, whose anytime-valid upper confidence bound
on the rate of exceeding requests is PARTIALLY_CERTIFIED
(:data:`~witcert_calculus.accounting.rate.UNIFORM_SAMPLE`).

Through vLLM (:func:`vllm_shadow_audit`) the requests are served by the engine with the plugin
metering its fp8 cache (``kv="fp8"``); the sampled ones are then scored teacher-forced along
the served continuation (one request per token with its full next-token distribution,
:mod:`witcert_adapters.vllm_plugin.offline`'s ``--score-file``) twice: by an engine on the same
fp8 cache (the served distribution at each prefix) and by one on the exact (bfloat16) cache,
the shadow recompute, both along the served token ids (the prompt tokenized as the engine
tokenized it when serving; a prompt whose tokens differ is counted in
:attr:`ShadowAudit.retokenized`). Every request's outcome (sampled or not, its largest step TV,
and the rate bound after it) goes into the served engine's verdict store
(:meth:`~witcert_adapters.vllm_plugin.store.VerdictStore.put_shadow`), beside its verdict.

Main declarations
-----------------
- :class:`ShadowSampler`: the decision before serving.
- :class:`RequestAudit`, :func:`serve_and_audit`: one request.
- :class:`ShadowAudit`, :func:`shadow_audit`: a run of requests and the fleet-level bound.
- :func:`vllm_shadow_audit`: the same through vLLM's engine with the plugin (served on its fp8
  cache, replayed on its exact cache).
- :func:`request_prompts`: a fixed, varied set of prompts.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, final

import torch

from witcert_adapters.depth import DepthStep, ModelNorms, compressed_step, depth_step, divergence
from witcert_calculus.accounting.rate import UNIFORM_SAMPLE, RateBound, RateState
from witcert_calculus.errors import InvalidValueError
from witcert_calculus.numerics.validation import nonneg_int, positive_int, real
from witcert_calculus.tiers import Assumption, Tier

__all__ = ["RequestAudit", "ShadowAudit", "ShadowSampler", "request_prompts",
           "serve_and_audit", "shadow_audit", "vllm_shadow_audit"]

_F64 = torch.float64


@final
@dataclass(frozen=True, slots=True)
class ShadowSampler:
    """Decides which requests are audited, from the request id and a seed alone.

    Attributes:
        rate: the audited fraction, in ``(0, 1]``.
        seed: the operator's seed (fixed before serving).

    Raises:
        InvalidValueError: on a rate outside ``(0, 1]`` or a negative seed.

    Example:
        >>> s = ShadowSampler(rate=0.5, seed=7)
        >>> s.sampled(3) == ShadowSampler(rate=0.5, seed=7).sampled(3)
        True
    """

    rate: float
    seed: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "rate", real("rate", self.rate, lo=0.0, hi=1.0, lo_open=True))
        object.__setattr__(self, "seed", nonneg_int("seed", self.seed))

    def sampled(self, request_id: int) -> bool:
        """Whether request ``request_id`` is audited: a uniform draw from SHA-256 of the seed
        and the id, below the rate."""
        rid = nonneg_int("request_id", request_id)
        digest = hashlib.sha256(f"{self.seed}:{rid}".encode()).digest()
        return int.from_bytes(digest[:8], "big") / 2.0 ** 64 < self.rate


@final
@dataclass(frozen=True, slots=True)
class RequestAudit:
    """One served request, and its audit when sampled.

    Attributes:
        request_id: the request.
        sampled: whether it was audited (decided before serving).
        tokens: the served continuation's token ids.
        tv: per decode step reading the compressed memory, the true next-token TV (empty when
            not sampled).
        kl: the same steps' ``KL(exact || served)``.
        depth: the depth bound and audit at the first such step (when sampled).
    """

    request_id: int
    sampled: bool
    tokens: tuple[int, ...]
    tv: tuple[float, ...] = ()
    kl: tuple[float, ...] = ()
    depth: DepthStep | None = None

    @property
    def max_tv(self) -> float:
        """The largest step TV (0.0 when not sampled)."""
        return max(self.tv, default=0.0)


def serve_and_audit(model: Any, ids: torch.Tensor, *, scheme: str, new_tokens: int,
                    request_id: int, sampled: bool, norms: ModelNorms) -> RequestAudit:
    """Serve one request greedily through the compressed memory; audit it when sampled.

    Raises:
        InvalidValueError: on ``new_tokens < 2`` (one decode step reads the memory).
    """
    from transformers import DynamicCache

    steps = positive_int("new_tokens", new_tokens)
    if steps < 2:
        raise InvalidValueError("new_tokens", new_tokens, "must be >= 2")
    layers = range(int(model.config.num_hidden_layers))
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        first = model(ids, cache=cache, use_cache=True).logits[0, -1]
    tokens = [int(torch.argmax(first))]
    served: list[torch.Tensor] = []
    for _ in range(steps - 1):
        logits = compressed_step(model, torch.tensor([[tokens[-1]]]), cache, scheme=scheme)
        served.append(logits)
        tokens.append(int(torch.argmax(logits)))
    if not sampled:
        return RequestAudit(request_id, False, tuple(tokens))
    full = torch.cat([ids, torch.tensor([tokens[:-1]])], dim=1)
    with torch.no_grad():
        exact = model(full).logits[0, ids.shape[1]:].to(_F64)
    tv, kl = divergence(torch.log_softmax(torch.stack(served), -1),
                        torch.log_softmax(exact, -1))
    depth = depth_step(model, torch.cat([ids, torch.tensor([[tokens[0]]])], dim=1),
                       scheme=scheme, window=layers, norms=norms)
    return RequestAudit(request_id, True, tuple(tokens), tuple(tv), tuple(kl), depth)


@final
@dataclass(frozen=True, slots=True)
class ShadowAudit:
    """A run of requests under one scheme, and the fleet-level rate bound.

    Attributes:
        scheme: the compression scheme served.
        threshold: a request exceeds when its largest step TV is above this.
        alpha: the bound's miscoverage level.
        requests: every request, in serving order.
        rate: the bound's final state (trials, events, upper bound).
        tier: PARTIALLY_CERTIFIED (the uniform-sample assumption), or EMPIRICAL when nothing
            was audited.
        assumptions: what the bound assumes.
        retokenized: audited requests whose scored continuation is not the served token
            sequence (vLLM path, a check; 0 on the Hugging Face path).
    """

    scheme: str
    threshold: float
    alpha: float
    requests: tuple[RequestAudit, ...]
    rate: RateState
    tier: Tier
    assumptions: tuple[Assumption, ...] = (UNIFORM_SAMPLE,)

    retokenized: int = 0

    @property
    def audited(self) -> tuple[RequestAudit, ...]:
        """The sampled requests."""
        return tuple(r for r in self.requests if r.sampled)

    def families(self) -> list[Any]:
        """The rate bound as Prometheus families labelled by the scheme
        (:func:`witcert_calculus.export.prometheus.rate_families`; extra ``metrics``)."""
        from witcert_calculus.export.prometheus import rate_families

        return rate_families(self.scheme, self.rate, threshold=self.threshold, alpha=self.alpha)


def shadow_audit(model: Any, tokenizer: Any, prompts: Sequence[str], *, scheme: str,
                 sampler: ShadowSampler, threshold: float, alpha: float, new_tokens: int,
                 norms: ModelNorms) -> ShadowAudit:
    """Serve ``prompts`` as requests ``0, 1, ...``, audit the sampled ones, bound the rate.

    Raises:
        InvalidValueError: on a threshold outside ``(0, 1)``.
    """
    tau = real("threshold", threshold, lo=0.0, hi=1.0, lo_open=True, hi_open=True)
    bound = RateBound(alpha=alpha)
    out: list[RequestAudit] = []
    for rid, prompt in enumerate(prompts):
        chosen = sampler.sampled(rid)           # decided before the request is served
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        audit = serve_and_audit(model, ids, scheme=scheme, new_tokens=new_tokens,
                                request_id=rid, sampled=chosen, norms=norms)
        if chosen:
            bound.observe(audit.max_tv > tau)
        out.append(audit)
    return ShadowAudit(scheme, tau, bound.alpha, tuple(out), bound.state, bound.tier)


def vllm_shadow_audit(prompts: Sequence[str], *, sampler: ShadowSampler, threshold: float,
                      alpha: float, new_tokens: int, work_dir: Path, kv: str = "fp8",
                      kv_space_gib: int = 1) -> ShadowAudit:
    """Serve ``prompts`` through vLLM with the plugin on its ``kv`` cache, replay the sampled
    ones exactly (see the module docstring), bound the rate of exceeding requests.

    Needs the engine's environment (``.venv-vllm``, made by ``scripts/setup.sh``).

    Raises:
        InvalidValueError: on a threshold outside ``(0, 1)`` or ``new_tokens < 2``.
        RuntimeError: an engine process failed.
    """
    import numpy as np

    from witcert_adapters.demo.models import smollm2_engine_dir
    from witcert_adapters.vllm_plugin.config import PluginConfig
    from witcert_adapters.vllm_plugin.launch import run_offline
    from witcert_adapters.vllm_plugin.store import ShadowRecord, VerdictStore

    tau = real("threshold", threshold, lo=0.0, hi=1.0, lo_open=True, hi_open=True)
    if positive_int("new_tokens", new_tokens) < 2:
        raise InvalidValueError("new_tokens", new_tokens, "must be >= 2")
    chosen = [sampler.sampled(rid) for rid in range(len(prompts))]   # before serving
    model = smollm2_engine_dir()
    work_dir = work_dir.resolve()       # the engines run in folders of their own
    work_dir.mkdir(parents=True, exist_ok=True)
    served = run_offline(PluginConfig(store=work_dir / "served.sqlite", tau=0.1), model=model,
                         kv=kv, prompts=list(prompts), max_tokens=new_tokens, repeat=1,
                         kv_space_gib=kv_space_gib)["requests"]
    audited = [i for i, c in enumerate(chosen) if c]
    pairs = work_dir / "pairs.json"
    pairs.write_text(json.dumps([[prompts[i], [int(t) for t in served[i]["token_ids"]]]
                                 for i in audited]))
    dists: dict[str, Any] = {}
    scored: list[dict[str, Any]] = []
    for cache in (kv, "auto"):
        out = work_dir / f"scores-{cache}.npz"
        rec = run_offline(None, model=model, kv=cache, prompts=["."], max_tokens=1, repeat=1,
                          kv_space_gib=kv_space_gib, timeout=3600.0,
                          extra=("--score-file", str(pairs), "--scores-out", str(out),
                                 "--prefix-caching"))
        dists[cache] = np.load(out)
        scored = rec["scored"]
    bound = RateBound(alpha=alpha)
    rows: list[RequestAudit] = []
    retokenized = 0
    store = VerdictStore(work_dir / "served.sqlite")
    name = f"vllm {kv}"
    for rid, c in enumerate(chosen):
        tokens = tuple(int(t) for t in served[rid]["token_ids"])
        if not c:
            rows.append(RequestAudit(rid, False, tokens))
            store.put_shadow(ShadowRecord(served[rid]["request_id"], name, False, None, None,
                                          bound.upper, bound.trials, bound.events, tau,
                                          bound.alpha))
            continue
        k = audited.index(rid)
        retokenized += tuple(scored[k]["token_ids"]) != tokens
        # every continuation token's distribution (the engine may read its cache at prefill)
        tv, kl = divergence(*(torch.tensor(dists[cache][f"item{k}"], dtype=_F64)
                               for cache in (kv, "auto")))
        row = RequestAudit(rid, True, tokens, tuple(tv), tuple(kl))
        bound.observe(row.max_tv > tau)
        rows.append(row)
        store.put_shadow(ShadowRecord(served[rid]["request_id"], name, True, row.max_tv,
                                      sum(kl) / len(kl), bound.upper, bound.trials,
                                      bound.events, tau, bound.alpha))
    store.close()
    return ShadowAudit(name, tau, bound.alpha, tuple(rows), bound.state, bound.tier,
                       retokenized=retokenized)


_SUBJECTS = ("photosynthesis", "the French Revolution", "a binary search tree", "volcanoes",
             "the stock market", "jazz music", "black holes", "the immune system",
             "machine translation", "the Roman Empire", "climate change", "chess openings",
             "bread baking", "quantum computing", "the water cycle", "honeybees")
_TEMPLATES = ("Explain how {} works in simple terms.", "Write a short story about {}.",
              "What are three facts about {}?", "The most surprising thing about {} is",
              "Give a one-paragraph summary of {}.", "Why do people find {} interesting?",
              "Describe {} to a ten-year-old.", "A common misconception about {} is that",
              "List the main ideas behind {}.", "Write a haiku about {}.",
              "What is the history of {}?", "Compare {} with something from everyday life.",
              "How would you teach {} in one lesson?", "What questions remain open about {}?",
              "In one sentence, {} is", "Here is a riddle about {}:")


def request_prompts(n: int) -> list[str]:
    """``n`` prompts (at most 256): every template over every subject, interleaved.

    Example:
        >>> request_prompts(2)
        ['Explain how photosynthesis works in simple terms.', 'Write a short story about the French Revolution.']
    """
    count = positive_int("n", n)
    pairs = [(t, s) for t, s in itertools.product(range(len(_TEMPLATES)), range(len(_SUBJECTS)))]
    pairs.sort(key=lambda ts: ((ts[1] - ts[0]) % len(_SUBJECTS), ts[0]))
    if count > len(pairs):
        raise InvalidValueError("n", n, f"must be at most {len(pairs)}")
    return [_TEMPLATES[t].format(_SUBJECTS[s]) for t, s in pairs[:count]]
