"""Chain specs: a composed contract written as text, JSON or TOML (what ``witcert explain`` reads).

The text form names the stages in pipeline order, joined by ``>>``; each stage is a bridge
name, with keyword arguments in parentheses when it takes any::

    witness(witness_max=0.02) >> score(scale=0.125, q_norm_max=12) >> eform
        >> selection(m_out=0.004, m_in=0.002)

Values are numbers, quoted strings, or bare metric names (``ratio``'s ``m_in``/``m_out``).
The JSON and TOML forms hold the same: ``{"site": "consume", "stages": [{"bridge": "score",
"scale": 0.125, "q_norm_max": 12}, ...]}`` (TOML: ``site = "consume"`` and one ``[[stages]]``
table per stage). ``site`` is ``consume`` (:class:`~witcert_calculus.metrics.AtConsume`, the
default) or ``write`` (:class:`~witcert_calculus.metrics.AtWrite`).

The bridges (:data:`BRIDGES`; each is the library function of the same meaning, so a spec
gets exactly the contract the code would build):

- ``witness(witness_max)``: :func:`~witcert_calculus.bridges.witness_contract`;
- ``score(scale, q_norm_max)``: :func:`~witcert_calculus.bridges.score_bridge`;
- ``eform``, ``tanh``, ``tanh_osc``, ``affine(eps0)``: the softmax-to-TV bridges;
- ``selector_mass``: :func:`~witcert_calculus.bridges.selector_mass_eform`;
- ``ratio(m_in, m_out, ratio, samples, statistic, set_type)``:
  :func:`~witcert_calculus.bridges.empirical_ratio_bridge` (EMPIRICAL);
- ``selection(m_out, m_in)``: :func:`~witcert_calculus.bridges.rank_prefix_selection`.

Every malformed spec raises :class:`~witcert_calculus.errors.ChainSpecError` naming the stage
(by position and text) and what is wrong with it; stages that do not meet in one metric
raise :class:`~witcert_calculus.errors.MetricMismatchError` as :func:`~witcert_calculus.
contracts.chain` does.

Main declarations: :func:`parse_chain_spec`, :func:`load_chain_spec`, :func:`build_chain`,
:class:`StageSpec`, :data:`BRIDGES`.
"""

from __future__ import annotations

import ast
import json
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast, final

from witcert_calculus.contracts import Contract
from witcert_calculus.errors import ChainSpecError
from witcert_calculus.metrics import AtConsume, AtWrite, Site, registered_metrics
from witcert_calculus.numerics.validation import json_object

__all__ = ["BRIDGES", "StageSpec", "build_chain", "load_chain_spec", "parse_chain_spec"]

SITES: Mapping[str, type[Site]] = {"consume": AtConsume, "write": AtWrite}


@final
@dataclass(frozen=True, slots=True)
class StageSpec:
    """One stage of a spec: a bridge name and its keyword arguments.

    Attributes:
        bridge: a key of :data:`BRIDGES`.
        args: its keyword arguments (numbers, strings).
        where: how the stage is named in errors (its position and text).
    """

    bridge: str
    args: Mapping[str, object]
    where: str


def _metric(site: type[Site], name: object, stage: StageSpec, key: str) -> Any:
    by_name: dict[str, Any] = {cls.__name__: cls for cls in registered_metrics()}
    if not isinstance(name, str) or name not in by_name:
        raise ChainSpecError(stage.where, f"{key}={name!r} is not a registered metric; one of "
                             f"{sorted(by_name)}")
    return by_name[name][site]


#: The bridge names a spec may use, with the keyword arguments each requires.
BRIDGES: Mapping[str, tuple[str, ...]] = {
    "witness": ("witness_max",), "score": ("scale", "q_norm_max"), "eform": (), "tanh": (),
    "tanh_osc": (), "affine": ("eps0",), "selector_mass": (), "selection": ("m_out", "m_in"),
    "ratio": ("m_in", "m_out", "ratio", "samples", "statistic", "set_type"),
}


def _constructors() -> dict[str, Callable[..., Contract[Any, Any]]]:
    from witcert_calculus import bridges as b  # needs numpy: loaded when a spec is built

    return {"witness": b.witness_contract, "score": b.score_bridge, "eform": b.softmax_tv_eform,
            "tanh": b.softmax_tv_tanh, "tanh_osc": b.softmax_tv_tanh_osc,
            "affine": b.softmax_tv_affine, "selector_mass": b.selector_mass_eform,
            "selection": b.rank_prefix_selection, "ratio": b.empirical_ratio_bridge}


def _literal(node: ast.expr, where: str, key: str) -> object:
    if isinstance(node, ast.Name):  # a bare metric name
        return node.id
    try:
        value = ast.literal_eval(node)
    except ValueError:
        raise ChainSpecError(where, f"{key}={ast.unparse(node)} is not a number, a quoted "
                             "string or a metric name") from None
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ChainSpecError(where, f"{key}={value!r} is not a number, a quoted string or a "
                             "metric name")
    return value


def _parse_stage(text: str, index: int) -> StageSpec:
    where = f"stage {index} ({text.strip()!r})"
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        raise ChainSpecError(where, "is not `name` or `name(key=value, ...)`") from None
    if isinstance(node, ast.Name):
        return StageSpec(node.id, {}, where)
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
        raise ChainSpecError(where, "is not `name` or `name(key=value, ...)`")
    if node.args:
        raise ChainSpecError(where, "takes keyword arguments only (key=value)")
    args: dict[str, object] = {}
    for kw in node.keywords:
        if kw.arg is None:
            raise ChainSpecError(where, "takes keyword arguments only (key=value)")
        args[kw.arg] = _literal(kw.value, where, kw.arg)
    return StageSpec(node.func.id, args, where)


def parse_chain_spec(text: str) -> list[StageSpec]:
    """The stages of a text spec (``a >> b(k=v) >> ...``), in order.

    Raises:
        ChainSpecError: an empty spec or a stage that is not ``name`` / ``name(key=value)``.

    Example:
        >>> [s.bridge for s in parse_chain_spec("score(scale=0.125, q_norm_max=12) >> eform")]
        ['score', 'eform']
    """
    if not isinstance(text, str) or not text.strip():
        raise ChainSpecError("spec", "is empty; write stages joined by `>>`")
    return [_parse_stage(part, i) for i, part in enumerate(text.split(">>"), 1)]


def _stages_of(raw: object, origin: str) -> tuple[str, list[StageSpec]]:
    data = json_object(raw)
    if data is None:
        raise ChainSpecError(origin, "must hold an object with `stages` (and optionally `site`)")
    unknown = sorted(set(data) - {"site", "stages"})
    if unknown:
        raise ChainSpecError(origin, f"has unknown keys {unknown}; expected `site`, `stages`")
    site = data.get("site", "consume")
    stages: object = data.get("stages")
    if not isinstance(stages, list) or not stages:
        raise ChainSpecError(origin, "needs a non-empty list `stages`")
    out: list[StageSpec] = []
    for i, st in enumerate(cast("list[object]", stages), 1):
        where = f"stage {i} of {origin}"
        obj = json_object(st)
        if obj is None or not isinstance(obj.get("bridge"), str):
            raise ChainSpecError(where, f"{st!r} is not an object with a string `bridge`")
        args = {k: v for k, v in obj.items() if k != "bridge"}
        for k, v in args.items():
            if isinstance(v, bool) or not isinstance(v, (int, float, str)):
                raise ChainSpecError(where, f"{k}={v!r} is not a number or a string")
        out.append(StageSpec(obj["bridge"], args, where))
    return _site_name(site, origin), out


def _site_name(site: object, origin: str) -> str:
    if site not in SITES:
        raise ChainSpecError(origin, f"site={site!r} is not one of {sorted(SITES)}")
    return str(site)


def load_chain_spec(spec: str, *, site: str | None = None) -> Contract[Any, Any]:
    """The contract a spec describes: a text spec, or a path to a ``.json`` / ``.toml`` file.

    Args:
        spec: the text spec, or the path of a JSON or TOML spec file.
        site: the observation site for a text spec (``consume`` when omitted); a file names
            its own, and a different ``site`` here is an error.

    Raises:
        ChainSpecError: a malformed spec, an unreadable file, an unknown bridge or site, a
            missing or unknown argument.
        MetricMismatchError: stages that do not meet in one metric.
    """
    path = Path(spec)
    if path.suffix in (".json", ".toml"):
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise ChainSpecError(str(path), f"cannot be read: {exc.strerror}") from None
        try:
            data = json.loads(raw) if path.suffix == ".json" else tomllib.loads(raw.decode())
        except (ValueError, UnicodeDecodeError) as exc:
            raise ChainSpecError(str(path), f"is not valid {path.suffix[1:].upper()}: {exc}"
                                 ) from None
        own, stages = _stages_of(data, str(path))
        if site is not None and _site_name(site, "site") != own:
            raise ChainSpecError(str(path), f"names site {own!r}, but site={site!r} was given")
        return build_chain(stages, site=own)
    return build_chain(parse_chain_spec(spec),
                       site="consume" if site is None else _site_name(site, "site"))


def build_chain(stages: Sequence[StageSpec], *, site: str = "consume") -> Contract[Any, Any]:
    """Build each stage with its library function and compose them with :func:`chain`.

    Raises:
        ChainSpecError: an unknown bridge, a missing or unknown argument, or an argument the
            bridge refuses (its own error is quoted).
        MetricMismatchError: stages that do not meet in one metric.
    """
    s = SITES[_site_name(site, "site")]
    makers = _constructors()
    built: list[Contract[Any, Any]] = []
    for st in stages:
        if st.bridge not in BRIDGES:
            raise ChainSpecError(st.where, f"names no bridge {st.bridge!r}; one of "
                                 f"{sorted(BRIDGES)}")
        keys, make = BRIDGES[st.bridge], makers[st.bridge]
        missing = [k for k in keys if k not in st.args]
        extra = sorted(set(st.args) - set(keys))
        if missing or extra:
            raise ChainSpecError(st.where, f"{st.bridge} takes {list(keys) or 'no arguments'}"
                                 + (f"; missing {missing}" if missing else "")
                                 + (f"; unknown {extra}" if extra else ""))
        args = dict(st.args)
        try:
            if st.bridge == "ratio":
                m_in, m_out = (_metric(s, args.pop(k), st, k) for k in ("m_in", "m_out"))
                built.append(make(m_in, m_out, **args))
            else:
                built.append(make(s, **args))
        except ChainSpecError:
            raise
        except (ValueError, TypeError) as exc:  # the bridge's own typed error names the value
            raise ChainSpecError(st.where, str(exc)) from None
    out = built[0]
    for c in built[1:]:
        out = out >> c
    return out
