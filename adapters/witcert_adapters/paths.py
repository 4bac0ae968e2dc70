"""Serving paths of vLLM's engine with the plugin, run for real and judged from their artifacts.

A real engine serves through many paths that each redefine what a slot, a block and a
request are: shared prefix blocks read by requests that did not write them, prefill split in
chunks, blocks freed by preemption and reused by other requests, many requests in one batch,
forked blocks of parallel samples, a request aborted and its id served again, speculative
decoding. Each path of :data:`PATHS` is served twice by vLLM's CPU build
(:mod:`witcert_adapters.vllm_plugin.path_run`): with the plugin on (audit on: every cell's
true total variation measured against its bound) and with the plugin off. The two records
make the path's artifact (:func:`run_path`, ``witcert paths run``), a JSON file holding the
engine's version and settings, the requests, every verdict, the engine's own counters
(preemptions, prefix-cache hits) and every request's token ids with the plugin on and off.

:func:`judge` reads an artifact only, and decides each contract layer of the path:

- **captured**: every served request instance has a verdict, and each verdict's cells are
  its rows times the model's layers times its heads (every layer's reads seen);
- **identity**: no verdict for a request that was not served, one verdict per served
  instance (an aborted request and its id served again are two), the fail-closed ones counted;
- **metered**: every cell of every verdict audited;
- **ledger**: every verdict's spend equals its recount (:func:`~witcert_adapters.vllm_plugin.
  verdicts.recount_spent`: one deterministic reading a metered step), and a verdict has a
  tier exactly when it did not fail closed;
- **eviction/reuse**: the path's regime happened, read from the engine's own counters or the
  verdicts (preemptions, prefix-cache hits, prefill chunks, mixed batches, forked samples,
  an aborted id served again); ``n/a`` on a path with no such regime;
- **quality**: the token ids with the plugin on equal those with it off (same engine, same
  cache dtype, same seeds);
- **audit**: no audited cell above its bound;

and gives the path one verdict of a fixed taxonomy (:data:`VERDICTS`): ``pass`` (every layer
holds), ``fail-method`` (a layer fails), ``blocked-upstream`` (the engine itself cannot serve
the path, plugin off: its error is the evidence), ``partial`` (no layer fails but the regime
did not happen), ``not-measured`` (no artifact, or the plugin refused the path at start-up,
which is how it declines a path it cannot meter soundly). :func:`render_matrix` prints the
table (``witcert paths matrix DIR``); ``docs/paths.md`` and the README hold the one generated
from the artifacts stored in ``docs/paths/``.

Main declarations:

- :class:`ServingPath`, :data:`PATHS`, :func:`serving_path`.
- :func:`run_path`: serve a path twice and write its artifact.
- :class:`Artifact`, :func:`load_artifact`: an artifact, checked field by field.
- :class:`Layer`, :class:`PathRow`, :func:`judge`, :data:`VERDICTS`, :data:`LAYERS`.
- :func:`render_matrix`, :func:`matrix_of`.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, Final, cast, final

from witcert_calculus.errors import InvalidValueError

__all__ = [
    "ENGINE",
    "LAYERS",
    "PATHS",
    "VERDICTS",
    "Artifact",
    "Layer",
    "PathRow",
    "ServingPath",
    "judge",
    "load_artifact",
    "matrix_of",
    "need",
    "read_json_object",
    "render_matrix",
    "run_path",
    "serve_spec",
    "served_verdicts",
    "serving_path",
    "slim",
]

#: The engine the artifacts come from: an artifact of another engine or version is refused.
ENGINE: Final = {"name": "vllm", "version": "0.32.0"}

#: The verdicts of a path, strongest first.
VERDICTS: Final = ("pass", "fail-method", "blocked-upstream", "partial", "not-measured")

#: The contract layers of a path, in the matrix's order.
LAYERS: Final = ("captured", "identity", "metered", "ledger", "eviction/reuse", "quality",
                  "audit")

_ARTIFACT_SCHEMA: Final = 1

_SENTENCES: Final = (
    "The river ran past the old mill and the miller sang.",
    "A ship left the harbour before the storm reached the coast.",
    "Seven students solved the puzzle in under an hour.",
    "The library keeps its oldest maps in a cold dry room.",
    "Bread rises faster in a warm kitchen than in a cold one.",
    "The orchestra tuned their instruments before the concert began.",
    "Bees carry pollen from flower to flower all summer long.",
    "The mountain road closes every winter after the first snow.",
)
# ~300 tokens: two whole blocks of vLLM's CPU block size (128 tokens), which the prefix cache
# shares (only whole blocks are shared)
_PREFIX: Final = ("You are a careful assistant. Answer briefly and precisely, and keep to "
                  "the facts you are given. " * 15)


def _prompts(count: int, *, prefix: str = "", repeat: int = 1) -> tuple[str, ...]:
    return tuple(prefix + f"Note {i}: " + " ".join([_SENTENCES[i % len(_SENTENCES)]] * repeat)
                 for i in range(count))


@final
@dataclass(frozen=True, slots=True)
class ServingPath:
    """One serving path: the engine's settings and the requests served through it.

    Attributes:
        name: the path's name (a key of :data:`PATHS`).
        what: what the path exercises, in words.
        engine: keyword arguments of vLLM's ``LLM`` beyond the model (``kv_cache_dtype``,
            ``max_num_seqs``, ``enable_prefix_caching``, ...).
        prompts: the prompts, served in order.
        in_flight: at most this many requests in the engine at once.
        max_tokens: tokens generated per request (``ignore_eos``).
        n: samples per request (``n > 1`` forks the prompt's blocks; temperature 0.8).
        seed: the sampling seed.
        abort: ``{"index": i, "after_steps": k}``: request ``i`` is aborted after ``k`` engine
            steps and its id is served again from the start.
        regime: the evidence that the path's regime happened: ``preemptions``,
            ``prefix_hits``, ``prefill_chunks``, ``mixed_batches``, ``forked``, ``drafts``
            (speculative tokens verified), ``reused_id``, or ``""`` (none to show: the layer is
            ``n/a``).
    """

    name: str
    what: str
    engine: Mapping[str, Any]
    prompts: tuple[str, ...]
    in_flight: int
    max_tokens: int = 12
    n: int = 1
    seed: int = 0
    abort: Mapping[str, int] | None = None
    regime: str = ""

    def spec(self) -> dict[str, Any]:
        """The JSON spec :mod:`witcert_adapters.vllm_plugin.path_run` serves."""
        out = asdict(self)
        out["engine"] = dict(self.engine)
        out["prompts"] = list(self.prompts)
        out["abort"] = None if self.abort is None else dict(self.abort)
        return out


def _engine(**kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"kv_cache_dtype": "fp8", "max_model_len": 512, "max_num_seqs": 8,
                            "max_num_batched_tokens": 512, "enable_prefix_caching": False}
    base.update(kw)
    return base


#: The serving paths, by name.
PATHS: Final[Mapping[str, ServingPath]] = {p.name: p for p in (
    ServingPath("prefix-caching-off", "a shared 300-token prefix, no prefix cache",
                _engine(), _prompts(4, prefix=_PREFIX), in_flight=2),
    ServingPath("prefix-caching-on", "the same requests with the prefix cache: later requests "
                "read blocks earlier ones wrote", _engine(enable_prefix_caching=True),
                _prompts(4, prefix=_PREFIX), in_flight=2, regime="prefix_hits"),
    ServingPath("chunked-prefill", "prompts of ~100 tokens prefilled in chunks of 32",
                _engine(max_num_batched_tokens=32), _prompts(3, repeat=8), in_flight=3,
                regime="prefill_chunks"),
    ServingPath("preemption", "a KV space of 6 blocks (of 128 tokens) for 8 requests that each "
                "grow into a second block: the scheduler preempts, frees blocks, recomputes, "
                "and other requests reuse them",
                _engine(num_gpu_blocks_override=6, max_model_len=256),
                _prompts(8, repeat=8), in_flight=8, max_tokens=48, regime="preemptions"),
    ServingPath("concurrency-1", "one request at a time", _engine(max_num_seqs=1),
                _prompts(3), in_flight=1),
    ServingPath("concurrency-8", "8 requests in flight, prefill chunks beside decode rows",
                _engine(max_num_seqs=8, max_num_batched_tokens=64), _prompts(8, repeat=3),
                in_flight=8, regime="mixed_batches"),
    ServingPath("concurrency-32", "32 requests in flight, prefill chunks beside decode rows",
                _engine(max_num_seqs=32, max_num_batched_tokens=128), _prompts(32, repeat=2),
                in_flight=32, max_tokens=8, regime="mixed_batches"),
    ServingPath("parallel-sampling", "n = 2 samples per request: the prompt's blocks forked",
                _engine(), _prompts(3), in_flight=3, n=2, seed=7, regime="forked"),
    ServingPath("abort-reuse", "a request aborted mid-generation (a client gone) and its id "
                "served again", _engine(), _prompts(3), in_flight=3, max_tokens=16,
                abort={"index": 0, "after_steps": 4}, regime="reused_id"),
    ServingPath("speculative-ngram", "speculative decoding with n-gram proposals",
                _engine(speculative_config={"method": "ngram", "num_speculative_tokens": 2,
                                            "prompt_lookup_max": 3, "prompt_lookup_min": 1}),
                _prompts(2, repeat=3), in_flight=2, regime="drafts"),
)}


def serving_path(name: str) -> ServingPath:
    """The path named ``name``.

    Raises:
        InvalidValueError: an unknown name (the known ones are in the message).
    """
    try:
        return PATHS[name]
    except KeyError:
        raise InvalidValueError("path", name, f"must be one of {', '.join(PATHS)}") from None


# --------------------------------------------------------------------------- running


def serve_spec(spec: Mapping[str, Any], *, model: Path, workdir: Path,
               config: Any | None, extra_env: Mapping[str, str] | None = None,
               timeout: float = 900.0) -> dict[str, Any]:
    """Serve one spec in a fresh engine process (:mod:`witcert_adapters.vllm_plugin.path_run`)
    and return its record.

    Args:
        spec: the JSON spec (:meth:`ServingPath.spec`).
        model: the model folder; ``workdir``: an existing folder for the spec and the record.
        config: the plugin's configuration (a ``PluginConfig``), ``None`` for the plugin off.
        extra_env: more variables for the engine's environment.

    Raises:
        RuntimeError: an engine process that died without writing its record.
    """
    from witcert_adapters.vllm_plugin.launch import engine_env, engine_python

    side = "off" if config is None else "on"
    spec_file = workdir / f"{spec['name']}-{side}.spec.json"
    spec_file.write_text(json.dumps(dict(spec)))
    out = workdir / f"{spec['name']}-{side}.json"
    env = engine_env(config)
    env.update(extra_env or {})
    proc = subprocess.run(
        [str(engine_python()), "-m", "witcert_adapters.vllm_plugin.path_run",
         "--spec", str(spec_file), "--model", str(model), "--out", str(out)],
        env=env, cwd=workdir, capture_output=True, text=True, timeout=timeout, check=False)
    if not out.exists():
        raise RuntimeError(f"{spec['name']} ({side}): the engine exited with "
                           f"{proc.returncode} without a record:\n"
                           f"{(proc.stdout + proc.stderr)[-4000:]}")
    record: dict[str, Any] = json.loads(out.read_text())
    return record


def run_path(path: ServingPath, *, model: Path, out_dir: Path, timeout: float = 900.0) -> Path:
    """Serve ``path`` with the plugin on (audit on) and off, and write its artifact.

    Returns:
        The artifact's file, ``out_dir / f"{path.name}.json"``.

    Raises:
        RuntimeError: an engine process that died without writing its record.
    """
    from witcert_adapters.vllm_plugin.config import PluginConfig

    out_dir.mkdir(parents=True, exist_ok=True)
    records: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for side in ("on", "off"):
            config = PluginConfig(store=Path(tmp) / "verdicts.sqlite", tau=0.1, audit=True) \
                if side == "on" else None
            records[side] = serve_spec(path.spec(), model=model, workdir=Path(tmp),
                                       config=config, timeout=timeout)
    artifact = {"schema": _ARTIFACT_SCHEMA, "path": path.name,
                "engine": records["off"].get("engine", ENGINE), "spec": path.spec(),
                "on": slim(records["on"]), "off": slim(records["off"])}
    target = out_dir / f"{path.name}.json"
    target.write_text(json.dumps(artifact, indent=1, sort_keys=True) + "\n")
    return target


def slim(record: Mapping[str, Any]) -> dict[str, Any]:
    """A run's record as an artifact keeps it: without its spec (the artifact's own) and the
    trace."""
    return {k: v for k, v in record.items() if k not in ("spec", "trace")}


# --------------------------------------------------------------------------- artifacts

_RUN_FIELDS: Final = ("engine", "plugin")
_SERVED_FIELDS: Final = ("outputs", "aborted", "counters", "steps", "model")


@final
@dataclass(frozen=True, slots=True)
class Artifact:
    """One path's artifact, checked: the spec and the two runs (plugin on, plugin off)."""

    path: str
    engine: Mapping[str, str]
    spec: Mapping[str, Any]
    on: Mapping[str, Any]
    off: Mapping[str, Any]
    source: str


def need(data: Mapping[str, Any], key: str, where: str, *, kind: str = "a path artifact"
         ) -> Any:
    """``data[key]``, or an error naming ``where.key`` as missing from ``kind``."""
    if key not in data:
        raise InvalidValueError(f"{where}.{key}", "missing", f"must be present in {kind}")
    return data[key]


def read_json_object(file: Path) -> dict[str, Any]:
    """An artifact file's JSON object.

    Raises:
        InvalidValueError: an unreadable file, not JSON, or not an object (the file named).
    """
    try:
        raw: object = json.loads(Path(file).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise InvalidValueError("artifact", str(file), f"must be a readable JSON file ({exc})") \
            from None
    if not isinstance(raw, dict):
        raise InvalidValueError("artifact", str(file), "must hold a JSON object")
    return cast(dict[str, Any], raw)


def load_artifact(file: Path) -> Artifact:
    """Read and check one artifact.

    Raises:
        InvalidValueError: not JSON, another schema, an unknown path, an engine other than
            :data:`ENGINE`, or a missing field (each named).
    """
    data = read_json_object(file)
    if need(data, "schema", "artifact") != _ARTIFACT_SCHEMA:
        raise InvalidValueError("artifact.schema", data["schema"], f"must be {_ARTIFACT_SCHEMA}")
    name = need(data, "path", "artifact")
    path = serving_path(name)
    if need(data, "spec", "artifact") != path.spec():
        raise InvalidValueError("artifact.spec", f"the spec stored in {Path(file).name}",
                                f"must be path {name!r} as defined now (run it again)")
    engine = need(data, "engine", "artifact")
    if engine != ENGINE:
        raise InvalidValueError("artifact.engine", engine, f"must be {ENGINE} (the engine the "
                                "plugin hooks into)")
    runs: dict[str, dict[str, Any]] = {side: need(data, side, "artifact")
                                        for side in ("on", "off")}
    for side, run in runs.items():
        for key in _RUN_FIELDS:
            need(run, key, side)
        if "refused" not in run:
            for key in _SERVED_FIELDS:
                need(run, key, side)
            if side == "on":
                need(run, "verdicts", side)
    if runs["on"]["plugin"] is not True or runs["off"]["plugin"] is not False:
        raise InvalidValueError("artifact.on.plugin / off.plugin",
                                f"{runs['on']['plugin']} / {runs['off']['plugin']}",
                                "must be true / false")
    return Artifact(path=name, engine=engine, spec=data["spec"], on=runs["on"],
                    off=runs["off"], source=Path(file).name)


# --------------------------------------------------------------------------- judging


@final
@dataclass(frozen=True, slots=True)
class Layer:
    """One contract layer of a path: ``ok``, ``fail``, ``n/a`` or ``not exercised``, and why."""

    status: str
    evidence: str


@final
@dataclass(frozen=True, slots=True)
class PathRow:
    """A path's row of the matrix: its layers, its verdict and the verdict's evidence."""

    path: str
    verdict: str
    evidence: str
    layers: Mapping[str, Layer] = field(default_factory=lambda: dict[str, Layer]())


def _external(request: str, n: int) -> str:
    """The served request a verdict belongs to: vLLM's id without its 8-character suffix, and
    for ``n > 1`` samples without the child's ``k_`` prefix."""
    # imported here: the plugin's package brings torch, which the path registry does not need
    from witcert_adapters.vllm_plugin.verdicts import external_id

    rid = external_id(request)
    head, sep, tail = rid.partition("_")
    return tail if n > 1 and sep and head.isdigit() else rid


def served_verdicts(run: Mapping[str, Any], n: int
                    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A served run's verdicts split in two: those of the requests it served (every sample of
    each, and an aborted instance), and the others."""
    served = set(run["outputs"])
    mine: list[dict[str, Any]] = []
    others: list[dict[str, Any]] = []
    for v in run["verdicts"]:
        (mine if _external(v["request"], n) in served else others).append(v)
    return mine, others


def _regime(spec: Mapping[str, Any], on: Mapping[str, Any], verdicts: list[dict[str, Any]]
            ) -> Layer:
    regime = spec.get("regime", "")
    counters: Mapping[str, float] = on["counters"]
    if regime == "":
        return Layer("n/a", "no block freed, shared or reused by design")
    if regime == "preemptions":
        k = int(counters.get("vllm:num_preemptions", 0))
        return Layer("ok" if k > 0 else "not exercised", f"{k} preemptions (engine counter)")
    if regime == "prefix_hits":
        k = int(counters.get("vllm:prefix_cache_hits", 0))
        return Layer("ok" if k > 0 else "not exercised", f"{k} prefix-cache hit tokens")
    if regime == "prefill_chunks":
        k = max((int(v["prefill_steps"]) for v in verdicts), default=0)
        return Layer("ok" if k >= 2 else "not exercised", f"up to {k} prefill chunks a request")
    if regime == "mixed_batches":
        k = sum(int(v["mixed_steps"]) for v in verdicts)
        return Layer("ok" if k > 0 else "not exercised", f"{k} request-steps in mixed batches")
    if regime == "forked":
        n = int(spec["n"])
        ok = all(len(o) == n for o in on["outputs"].values())
        return Layer("ok" if ok and n > 1 else "not exercised",
                     f"{n} samples for each of {len(on['outputs'])} requests")
    if regime == "drafts":
        k = int(counters.get("vllm:spec_decode_num_drafts", 0))
        return Layer("ok" if k > 0 else "not exercised",
                     f"{k} drafts verified, "
                     f"{int(counters.get('vllm:spec_decode_num_draft_tokens', 0))} draft tokens, "
                     f"{int(counters.get('vllm:spec_decode_num_accepted_tokens', 0))} accepted "
                     "(engine counters)")
    if regime == "reused_id":
        k = len(on["aborted"])
        return Layer("ok" if k > 0 else "not exercised",
                     f"{k} request aborted mid-generation and its id served again")
    raise InvalidValueError("spec.regime", regime, "must be one of preemptions, prefix_hits, "
                            "prefill_chunks, mixed_batches, forked, drafts, reused_id or ''")


def judge(artifact: Artifact) -> PathRow:
    """Decide a path's layers and verdict from its artifact alone."""
    on, off, spec = artifact.on, artifact.off, artifact.spec
    if "refused" in off:
        return PathRow(artifact.path, "blocked-upstream",
                       f"vLLM {artifact.engine['version']} (plugin off) cannot serve it: "
                       f"{_first_line(off['refused'])}")
    if "refused" in on:
        return PathRow(artifact.path, "not-measured", "the plugin refuses it at start-up: "
                       f"{_first_line(on['refused'])}")
    n = int(spec["n"])
    served = set(on["outputs"])
    mine, others = served_verdicts(on, n)
    per_cell = int(on["model"]["layers"]) * int(on["model"]["heads"])
    instances = n * len(served) + len(on["aborted"])
    layers: dict[str, Layer] = {}
    short = [v["request"] for v in mine if v["cells"] != v["rows"] * per_cell or v["cells"] == 0]
    layers["captured"] = Layer(
        "ok" if len(mine) == instances and not short else "fail",
        f"{len(mine)} verdicts for {instances} served instances; cells = rows x "
        f"{per_cell} (layers x heads) for " + ("all" if not short else f"all but {short}"))
    failed_closed = sum(1 for v in mine if v["failure"] is not None)
    # the engine's own one-token request after the run (it flushes the last verdicts) is known
    stray = [v["request"] for v in others if not _external(v["request"], 1).isdigit()]
    layers["identity"] = Layer(
        "ok" if not stray and len(mine) == instances else "fail",
        f"{len(stray)} verdicts for unserved requests; {failed_closed} read(s) failed closed")
    unaudited = sum(int(v["cells"]) - int(v["audited"]) for v in mine)
    layers["metered"] = Layer("ok" if unaudited == 0 and mine else "fail",
                              f"{sum(int(v['audited']) for v in mine)} cells audited, "
                              f"{unaudited} not")
    from witcert_adapters.vllm_plugin.verdicts import recount_spent

    off_count = [v["request"] for v in mine
                 if Fraction(v["spent"]) != recount_spent(v) or
                 (v["failure"] is None) == (v["tier"] is None)]
    layers["ledger"] = Layer(
        "ok" if not off_count else "fail",
        f"spend = recount for {len(mine) - len(off_count)} of {len(mine)} verdicts "
        f"({sum(int(v['steps']) for v in mine)} readings, each deterministic)" +
        (f"; not for {off_count[:3]}" if off_count else ""))
    layers["eviction/reuse"] = _regime(spec, on, mine)
    differ = [rid for rid in served if on["outputs"][rid] != off["outputs"].get(rid)]
    layers["quality"] = Layer("ok" if not differ else "fail",
                              f"token ids on = off for {len(served) - len(differ)} of "
                              f"{len(served)} requests ({spec['engine']['kv_cache_dtype']} "
                              "cache)")
    violations = sum(int(v["violations"]) for v in mine)
    true_max = max((float(v["true_max"]) for v in mine), default=0.0)
    layers["audit"] = Layer("ok" if violations == 0 else "fail",
                            f"{violations} violations (true TV up to {true_max:.3g})")
    failing = [k for k, layer in layers.items() if layer.status == "fail"]
    if failing:
        return PathRow(artifact.path, "fail-method",
                       "; ".join(f"{k}: {layers[k].evidence}" for k in failing), layers)
    idle = [k for k, layer in layers.items() if layer.status == "not exercised"]
    if idle:
        return PathRow(artifact.path, "partial",
                       "; ".join(f"{k}: {layers[k].evidence}" for k in idle), layers)
    return PathRow(artifact.path, "pass",
                   f"{len(mine)} requests, {sum(int(v['cells']) for v in mine)} cells, "
                   f"{violations} violations; {layers['eviction/reuse'].evidence}", layers)


def _first_line(text: str) -> str:
    line = str(text).strip().splitlines()[0] if str(text).strip() else "(no message)"
    return line if len(line) <= 160 else line[:157] + "..."


# --------------------------------------------------------------------------- the matrix


def matrix_of(directory: Path) -> list[PathRow]:
    """Judge every path of :data:`PATHS` from the artifacts in ``directory`` (a path with no
    artifact is ``not-measured``).

    Raises:
        InvalidValueError: no such folder, an artifact that does not check, or a file for an
            unknown path.
    """
    if not Path(directory).is_dir():
        raise InvalidValueError("folder", str(directory), "must be a folder of path artifacts")
    rows: list[PathRow] = []
    found = {f.stem: f for f in sorted(Path(directory).glob("*.json"))}
    for stem in found:
        serving_path(stem)
    for name in PATHS:
        if name not in found:
            rows.append(PathRow(name, "not-measured", "no artifact"))
            continue
        art = load_artifact(found[name])
        if art.path != name:
            raise InvalidValueError(f"{found[name].name}.path", art.path, f"must be {name!r}")
        rows.append(judge(art))
    return rows


def render_matrix(rows: Sequence[PathRow]) -> str:
    """The matrix as a Markdown table: a column per layer, the verdict and its evidence."""
    head = "| path | " + " | ".join(LAYERS) + " | verdict | evidence |"
    lines = [head, "|" + "---|" * (len(LAYERS) + 3)]
    for row in rows:
        cells = [row.layers[k].status if k in row.layers else "-" for k in LAYERS]
        lines.append(f"| {row.path} | " + " | ".join(cells) +
                     f" | **{row.verdict}** | {row.evidence.replace('|', '/')} |")
    return "\n".join(lines) + "\n"
