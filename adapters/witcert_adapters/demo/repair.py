"""The repairing gate on SmolLM2: quality uncompressed, compressed (raw) and repaired (gated).

For each scheme, every item of a fixed retrieval battery is run three ways through the
Hugging Face cache: uncompressed (a plain :class:`~transformers.DynamicCache`), raw (a
:class:`~witcert_adapters.witness_cache.WitnessCache` that compresses every write, no repair) and
gated (a :class:`~witcert_adapters.repair.RepairCache` that compresses every write and pages in
exact blocks whenever a (layer, query head) meter exceeds the threshold; see
:mod:`witcert_adapters.repair`).

The battery (:func:`retrieval_battery`): each item holds ``facts`` key-value needles
"The code for <name> is <4 digits>." among ``filler`` filler sentences each (about 290
tokens), then asks for one code and ends with "The code for <name> is". The items are drawn
once from a seeded generator; the uncompressed model's accuracy on them is measured and
reported next to the compressed ones (it is not 1: no item is dropped).

Measurements, per run, over the fixed continuation ``" <code>."`` of every item, teacher-forced
(the prompt prefilled, then one decode step per continuation token; the prefill's last row
predicts the first continuation token):

- ``kl``: mean ``KL(uncompressed || run)`` in nats of the next-token distributions, and
  ``top1``: their top-1 agreement (:func:`~witcert_adapters.demo.measure.kl_top1`), against
  the uncompressed model's logits from one full forward over prompt and continuation;
- ``retrieval``: the share of items whose every answer token (the space and the four digits)
  is the run's top-1 prediction; under teacher forcing along the correct answer this is
  exactly "greedy decoding emits the answer".

The gated runs report ``page_in_bytes`` (keys and values moved from the backing store),
``page_in_fraction`` (paged over stored slot-heads, over all items) and ``gate``:
``"certified"`` when every repair decision of the scheme followed the certified decrease,
else ``"risk-ranked"``.

Main declarations
-----------------
- :func:`run_repair`: the whole measurement; writes ``repair.json`` and returns it.
- :func:`retrieval_battery`, :class:`RetrievalItem`: the battery.
- :class:`Quality`: one run's kl, top-1 and retrieval accuracy.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, final

import torch
from transformers import DynamicCache

from witcert_adapters.architectures import spec_for
from witcert_adapters.demo.measure import kl_top1
from witcert_adapters.demo.models import load_smollm2
from witcert_adapters.demo.report import Json
from witcert_adapters.demo.settings import MODEL_NAME
from witcert_adapters.repair import GateLabel, RepairPolicy, RepairSummary, attach_repair
from witcert_adapters.schemes import get_scheme
from witcert_adapters.witness_cache import WitnessCache
from witcert_calculus.errors import InvalidValueError
from witcert_calculus.numerics.validation import positive_int

__all__ = ["Quality", "REPAIR_SCHEMES", "RetrievalItem", "retrieval_battery", "run_repair"]

REPAIR_SCHEMES: Final = ("fp8_e4m3", "int4_g32", "kivi2_g32")
_ITEMS: Final = 12
_FACTS: Final = 4
_FILLER_PER_FACT: Final = 6
_SEED: Final = 7
_NAMES: Final = ("Alice", "Bruno", "Chen", "Dmitri", "Elena", "Farah", "Gustav", "Hiro", "Ines",
                 "Jonas", "Kemal", "Lena")
_FILLER: Final = (
    "The weather was mild and the streets were quiet.", "A train left the station on time.",
    "Someone was reading a newspaper in the park.", "The museum opened a new exhibition.",
    "Rain was expected later in the evening.", "A cat slept on the warm windowsill.",
    "The bakery on the corner sold fresh bread.", "Two children played chess under a tree.")


@final
@dataclass(frozen=True, slots=True)
class RetrievalItem:
    """One needle question.

    Attributes:
        prompt: context, question and the answer's lead-in ("The code for <name> is").
        answer: the four digits asked for.
    """

    prompt: str
    answer: str

    @property
    def continuation(self) -> str:
        """The fixed continuation the runs are teacher-forced along."""
        return f" {self.answer}."


def retrieval_battery(*, items: int = _ITEMS, facts: int = _FACTS, filler: int = _FILLER_PER_FACT,
                      seed: int = _SEED) -> tuple[RetrievalItem, ...]:
    """The fixed battery: ``items`` prompts with ``facts`` needles among filler each.

    Args:
        items: number of items.
        facts: needles per item (at most 12 names).
        filler: filler sentences before each needle (up to 8 distinct ones; more are drawn
            with replacement, for long contexts).
        seed: the generator's seed.

    Returns:
        The items, in order.

    Raises:
        InvalidValueError: a count out of range.

    Example:
        >>> retrieval_battery(items=1)[0].prompt.endswith("is")
        True
    """
    positive_int("items", items)
    if not 1 <= positive_int("facts", facts) <= len(_NAMES):
        raise InvalidValueError("facts", facts, f"must be at most {len(_NAMES)}")
    positive_int("filler", filler)
    rng = random.Random(seed)
    out: list[RetrievalItem] = []
    for _ in range(items):
        names = rng.sample(_NAMES, facts)
        codes = {n: f"{rng.randint(1000, 9999)}" for n in names}
        lines: list[str] = []
        for n in names:
            lines += rng.sample(_FILLER, filler) if filler <= len(_FILLER) else \
                rng.choices(_FILLER, k=filler)
            lines.append(f"The code for {n} is {codes[n]}.")
        lines += rng.sample(_FILLER, 2)
        asked = rng.choice(names)
        prompt = (" ".join(lines) + f"\n\nQuestion: What is the code for {asked}?\n"
                  f"Answer: The code for {asked} is")
        out.append(RetrievalItem(prompt, codes[asked]))
    return tuple(out)


@final
@dataclass(frozen=True, slots=True)
class Quality:
    """One run's quality over the battery.

    Attributes:
        kl: mean teacher-forced ``KL(uncompressed || run)`` in nats.
        top1: top-1 agreement with the uncompressed model.
        retrieval: share of items answered exactly.
    """

    kl: float
    top1: float
    retrieval: float

    def json(self) -> Json:
        """``{"kl": ..., "top1": ..., "retrieval": ...}``."""
        return {"kl": self.kl, "top1": self.top1, "retrieval": self.retrieval}


@final
@dataclass(frozen=True, slots=True)
class _Encoded:
    # One item as tokens: prompt and continuation, the reference logits, the answer length.
    ids: torch.Tensor  # [1, P + n]
    prompt_len: int
    answer_len: int  # continuation tokens that make up the answer (the space and the digits)
    reference: torch.Tensor  # [n, V] uncompressed logits predicting each continuation token

    @property
    def targets(self) -> torch.Tensor:
        return self.ids[0, self.prompt_len:]


def _encode(model: Any, tokenizer: Any, item: RetrievalItem) -> _Encoded:
    prompt: list[int] = tokenizer(item.prompt).input_ids
    full: list[int] = tokenizer(item.prompt + item.continuation).input_ids
    plen = len(prompt)
    if full[:plen] != prompt:
        raise InvalidValueError("continuation", item.continuation,
                                "must tokenize as a suffix of the prompt's tokens")
    answer: list[int] = tokenizer(item.prompt + f" {item.answer}").input_ids
    if full[:len(answer)] != answer:
        raise InvalidValueError("answer", item.answer,
                                "must tokenize as a prefix of the continuation's tokens")
    ids = torch.tensor([full])
    with torch.no_grad():
        logits = model(ids).logits[0, plen - 1:-1]
    return _Encoded(ids, plen, len(answer) - plen, logits)


def _teacher_forced(model: Any, enc: _Encoded, cache: Any) -> torch.Tensor:
    # Prefill the prompt, then one decode step per continuation token but the last.
    ids, plen = enc.ids, enc.prompt_len
    with torch.no_grad():
        rows = [model(ids[:, :plen], cache=cache, use_cache=True).logits[0, -1]]
        rows += [model(ids[:, t:t + 1], cache=cache, use_cache=True).logits[0, -1]
                 for t in range(plen, int(ids.shape[1]) - 1)]
    return torch.stack(rows)


def _quality(model: Any, battery: Sequence[_Encoded], new_cache: Callable[[], Any],
             done: Callable[[Any], None] | None = None) -> Quality:
    kls: list[float] = []
    agree: list[bool] = []
    hits = 0
    for enc in battery:
        cache = new_cache()
        logits = _teacher_forced(model, enc, cache)
        if done is not None:
            done(cache)
        kl, top1 = kl_top1(enc.reference, logits)
        kls += kl
        agree += top1
        pred = logits.argmax(dim=-1)
        hits += bool((pred[:enc.answer_len] == enc.targets[:enc.answer_len]).all())
    return Quality(sum(kls) / len(kls), sum(agree) / len(agree), hits / len(battery))


def _merge(parts: Sequence[RepairSummary]) -> tuple[int, int, int, int, int, GateLabel]:
    decisions = sum(p.decisions for p in parts)
    certified = sum(p.certified for p in parts)
    label = GateLabel.CERTIFIED if certified == decisions else GateLabel.RISK_RANKED
    return (decisions, certified, sum(p.paged_slots for p in parts),
            sum(p.stored_slots for p in parts), sum(p.page_in_bytes for p in parts), label)


def run_repair(out: Path, *, schemes: tuple[str, ...] = REPAIR_SCHEMES, threshold: float = 0.2,
               threads: int = 1) -> Json:
    """Measure uncompressed, raw and gated quality per scheme on SmolLM2; write ``repair.json``.

    Args:
        out: the output folder (created if missing).
        schemes: registered scheme names, in report order.
        threshold: the gate's ``tau`` in ``(0, 1)``.
        threads: torch CPU threads.

    Returns:
        The JSON object written to ``out/repair.json``: ``threshold``, ``block_size``, the
        battery's description, ``quality_uncompressed`` and, under ``schemes``, per scheme
        ``quality_uncompressed``, ``quality_raw``, ``quality_gated`` (each ``kl``, ``top1``,
        ``retrieval``), ``page_in_bytes``, ``page_in_fraction``, ``gate``, ``decisions``,
        ``certified_decisions`` and ``threshold``.

    Raises:
        InvalidValueError: an unknown scheme, no scheme, or a threshold outside ``(0, 1)``.

    Example:
        >>> # report = run_repair(Path("out"), schemes=("fp8_e4m3",))
        >>> # report["schemes"]["fp8_e4m3"]["gate"]
    """
    if not schemes:
        raise InvalidValueError("schemes", schemes, "must name at least one scheme")
    for name in schemes:
        get_scheme(name)
    policy = RepairPolicy(threshold)
    torch.set_num_threads(positive_int("threads", threads))
    began = time.perf_counter()
    model, tokenizer = load_smollm2()
    spec = spec_for(model.config.model_type)
    items = retrieval_battery()
    battery = [_encode(model, tokenizer, item) for item in items]
    uncompressed = _quality(model, battery, lambda: DynamicCache(config=model.config))
    per_scheme: dict[str, Json] = {}
    for name in schemes:
        scheme = get_scheme(name)
        raw = _quality(model, battery, lambda: WitnessCache(config=model.config, spec=spec,
                                                            scheme=scheme))
        summaries: list[RepairSummary] = []
        with attach_repair(model, scheme=name, threshold=policy.threshold,
                           block_size=policy.block_size) as rep:
            gated = _quality(model, battery, rep.new_cache,
                             lambda cache: summaries.append(cache.summary()))
        decisions, certified, paged, stored, moved, label = _merge(summaries)
        per_scheme[name] = {
            "quality_uncompressed": uncompressed.json(), "quality_raw": raw.json(),
            "quality_gated": gated.json(), "page_in_bytes": moved,
            "page_in_fraction": paged / stored if stored else 0.0, "gate": str(label),
            "decisions": decisions, "certified_decisions": certified,
            "threshold": policy.threshold}
    lengths = [enc.prompt_len for enc in battery]
    report: Json = {
        "model": MODEL_NAME, "threshold": policy.threshold, "block_size": policy.block_size,
        "battery": {"items": len(battery), "facts_per_item": _FACTS, "seed": _SEED,
                    "prompt_tokens": [min(lengths), max(lengths)],
                    "steps": sum(int(e.reference.shape[0]) for e in battery)},
        "quality_uncompressed": uncompressed.json(), "schemes": per_scheme,
        "wall_s": round(time.perf_counter() - began, 1)}
    out.mkdir(parents=True, exist_ok=True)
    (out / "repair.json").write_text(json.dumps(report, indent=2) + "\n")
    return report
