"""Recorded entry traces: per-step entry bounds on disk, replayed into the trade-off curve.

A trace is a JSON Lines file. The first line is the header::

    {"format": "witcert-entry-trace", "version": 1, "metric": "AttentionTV[AtConsume]",
     "aggregate": "max", "saturation": 1.0}

``aggregate`` is how a step's kept entry bounds combine (``sum`` or ``max``,
:class:`~witcert_calculus.accounting.entries.Aggregate`), ``saturation`` the metric's saturation or
``null``, ``metric`` a label. Every later line is one step::

    {"request": "int8_token/1", "step": 0, "bounds": [0.12, 0.031, ...]}

``bounds`` holds the step's per-entry upper bounds (finite, ``>= 0``; e.g. one TV meter value
per (layer, head) cell of a decode step), ``request`` and ``step`` label it. The demo writes
one trace per scheme (``python -m witcert_adapters.demo`` writes ``traces/SCHEME.jsonl``), and
``witcert ledger replay TRACE`` replays one with :func:`replay_entry_trace`.

Every malformed line raises :class:`~witcert_calculus.errors.InvalidValueError` naming the
file and line.

Main declarations: :class:`EntryTrace`, :func:`write_entry_trace`, :func:`read_entry_trace`,
:func:`replay_entry_trace`.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, final

import numpy as np
import numpy.typing as npt

from witcert_calculus.accounting.entries import Aggregate, TradeoffCurve, tradeoff_curve
from witcert_calculus.errors import InvalidValueError
from witcert_calculus.numerics.validation import json_object, positive_int

__all__ = ["EntryTrace", "read_entry_trace", "replay_entry_trace", "write_entry_trace"]

FORMAT = "witcert-entry-trace"
VERSION = 1


@final
@dataclass(frozen=True, eq=False)
class EntryTrace:
    """A recorded trace.

    Attributes:
        metric: the entries' metric, as a label.
        aggregate: how a step's kept bounds combine.
        saturation: the metric's saturation (``None``: none).
        steps: one array of entry bounds per step, in file order.
        labels: ``(request, step)`` of each step.
    """

    metric: str
    aggregate: Aggregate
    saturation: float | None
    steps: tuple[npt.NDArray[np.float64], ...]
    labels: tuple[tuple[str, int], ...]


def _aggregate(value: object, where: str) -> Aggregate:
    try:
        return Aggregate(value)
    except ValueError:
        raise InvalidValueError(f"{where}: aggregate", value,
                                f"must be one of {[a.value for a in Aggregate]}") from None


def write_entry_trace(path: str | os.PathLike[str], steps: Sequence[npt.ArrayLike], *,
                      labels: Sequence[tuple[str, int]], metric: str,
                      aggregate: Aggregate = Aggregate.MAX,
                      saturation: float | None = 1.0) -> None:
    """Write a trace: the header, then one line per step.

    Raises:
        InvalidValueError: no steps, labels of another length, or a step whose bounds are
            not finite and ``>= 0``.
    """
    if not steps:
        raise InvalidValueError("steps", steps, "needs at least one step")
    if len(labels) != len(steps):
        raise InvalidValueError("labels", len(labels), f"must label each of the {len(steps)} steps")
    lines = [json.dumps({"format": FORMAT, "version": VERSION, "metric": metric,
                         "aggregate": aggregate.value, "saturation": saturation})]
    for i, ((req, step), b) in enumerate(zip(labels, steps, strict=True)):
        arr = np.asarray(b, dtype=np.float64).ravel()
        if not bool(np.isfinite(arr).all()) or bool((arr < 0).any()):
            raise InvalidValueError(f"steps[{i}]", b, "must hold finite bounds >= 0")
        lines.append(json.dumps({"request": str(req), "step": int(step),
                                 "bounds": arr.tolist()}))
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


def _header(line: str, where: str) -> dict[str, Any]:
    try:
        parsed: object = json.loads(line)
    except ValueError:
        raise InvalidValueError(where, line[:80], "is not a JSON header line") from None
    head = json_object(parsed)
    if head is None or head.get("format") != FORMAT:
        raise InvalidValueError(where, line[:80], f"is not a {FORMAT} header")
    if head.get("version") != VERSION:
        raise InvalidValueError(f"{where}: version", head.get("version"),
                                f"must be {VERSION}")
    sat = head.get("saturation")
    if sat is not None and (isinstance(sat, bool) or not isinstance(sat, (int, float))
                            or not math.isfinite(sat) or sat <= 0):
        raise InvalidValueError(f"{where}: saturation", sat, "must be null or finite and > 0")
    if not isinstance(head.get("metric"), str):
        raise InvalidValueError(f"{where}: metric", head.get("metric"), "must be a string")
    return head


def read_entry_trace(path: str | os.PathLike[str]) -> EntryTrace:
    """Read a trace written by :func:`write_entry_trace` (or by hand, in the same format).

    Raises:
        InvalidValueError: an unreadable file, a bad header, a malformed step line (named by
            its line number), or a trace without steps.
    """
    name = os.fspath(path)
    try:
        with open(name, encoding="utf-8") as f:
            text = f.read().splitlines()
    except OSError as exc:
        raise InvalidValueError("trace", name, f"cannot be read: {exc.strerror}") from None
    if not text:
        raise InvalidValueError("trace", name, "is empty")
    head = _header(text[0], f"{name}:1")
    steps: list[npt.NDArray[np.float64]] = []
    labels: list[tuple[str, int]] = []
    for n, line in enumerate(text[1:], 2):
        where = f"{name}:{n}"
        if not line.strip():
            continue
        try:
            parsed = json.loads(line)
        except ValueError:
            raise InvalidValueError(where, line[:80], "is not a JSON line") from None
        row = json_object(parsed)
        if row is None or not isinstance(row.get("bounds"), list) \
                or not isinstance(row.get("request"), str) \
                or isinstance(row.get("step"), bool) or not isinstance(row.get("step"), int):
            raise InvalidValueError(where, line[:80], "must hold `request` (string), `step` "
                                    "(integer) and `bounds` (a list)")
        try:
            arr = np.asarray(row["bounds"], dtype=np.float64)
        except (TypeError, ValueError):
            raise InvalidValueError(f"{where}: bounds", row["bounds"], "must be numbers") from None
        if arr.ndim != 1 or arr.size == 0 or not bool(np.isfinite(arr).all()) \
                or bool((arr < 0).any()):
            raise InvalidValueError(f"{where}: bounds", row["bounds"],
                                    "must be a non-empty list of finite bounds >= 0")
        steps.append(arr)
        labels.append((row["request"], row["step"]))
    if not steps:
        raise InvalidValueError("trace", name, "holds a header and no steps")
    return EntryTrace(metric=head["metric"], aggregate=_aggregate(head.get("aggregate"), name),
                      saturation=None if head.get("saturation") is None
                      else float(head["saturation"]),
                      steps=tuple(steps), labels=tuple(labels))


def replay_entry_trace(trace: EntryTrace, *, thresholds: npt.ArrayLike | None = None,
                       points: int = 41) -> TradeoffCurve:
    """The retention / per-step bound trade-off of a trace (:func:`~witcert_calculus.accounting.entries.
    tradeoff_curve`) at ``thresholds``, by default at ``points`` thresholds spread evenly from
    0 to the largest bound.

    Raises:
        InvalidValueError: ``points`` below 2, or bad thresholds.

    Example:
        >>> t = EntryTrace("TV", Aggregate.MAX, 1.0, (np.array([0.1, 0.3]),), (("r", 0),))
        >>> replay_entry_trace(t, thresholds=[0.2, 0.3]).retained_fraction.tolist()
        [0.5, 1.0]
    """
    if thresholds is None:
        top = max(float(s.max()) for s in trace.steps)
        thresholds = np.linspace(0.0, top, positive_int("points", points, minimum=2))
    return tradeoff_curve(list(trace.steps), thresholds=thresholds, aggregate=trace.aggregate,
                          saturation=trace.saturation)
