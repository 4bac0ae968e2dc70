"""The SGLang adapter on the installed SGLang 0.5.23 source, its kernels in Triton's
interpreter: anchored injection and byte-identical revert, bit-identical kernels with the
switch off, witnesses written by the real KV pools, the meter accumulated inside SGLang's
stage-1 decode kernels and in its extend (prefill) kernel against the torch meter on the
same attention (GQA, MHA, MLA; prefill: GQA, MHA), bounds above the exact TV, the
radix-cache refusal, and readings into ledger accounts and the gate.

SGLang's configuration package imports ``torchvision`` (for vision models this adapter never
touches), and the registry's torchvision wheels fail against this CPU torch. The pool's
import therefore runs with a minimal, explicit stand-in of the three torchvision modules it
names (:func:`_torchvision_stand_in`), installed after ``import sglang`` (so transformers has
already recorded that torchvision is absent) and removed at teardown.
"""

from __future__ import annotations

import enum
import hashlib
import importlib
import importlib.machinery
import json
import math
import os
import shutil
import sys
import types
import warnings
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
# scripts/setup.sh installs SGLang into the test environment: its absence is a failure, not a skip
import sglang  # noqa: E402,F401

from witcert_adapters.injection import MANIFEST, Anchor, active_patches, apply_anchors, \
    patch_file  # noqa: E402
from witcert_adapters.sglang import installer as inst  # noqa: E402
from witcert_adapters.sglang import runtime  # noqa: E402
from witcert_adapters.sglang.config import SGLangConfig, load  # noqa: E402
from witcert_adapters.vllm_plugin.verdicts import Accounts  # noqa: E402
from witcert_calculus.errors import EngineMismatchError, InjectionError, \
    InvalidValueError  # noqa: E402
from witcert_calculus.meters.witness import RopeLayout  # noqa: E402
from witcert_kernels.meter import logit_bound, tv_bounds_batch  # noqa: E402
from witcert_kernels.triton_witness import witness_write  # noqa: E402

# SGLang's own kernels in Triton's interpreter: CI runs them, scripts/test.sh --quick does not.
pytestmark = pytest.mark.engine
torch.set_num_threads(1)
BANDS = 8
ON = SGLangConfig(enabled=True, bands=BANDS, layout=RopeLayout.HALF_SPLIT)
TV_NAMES = ("torchvision", "torchvision.transforms", "torchvision.transforms.functional")


def _torchvision_stand_in() -> None:
    """The names SGLang's config modules import from torchvision at import time, no more."""
    mods = {n: types.ModuleType(n) for n in TV_NAMES}
    for n, m in mods.items():
        m.__spec__ = importlib.machinery.ModuleSpec(n, None)

    class InterpolationMode(enum.Enum):
        NEAREST = "nearest"
        BILINEAR = "bilinear"
        BICUBIC = "bicubic"

    setattr(mods["torchvision.transforms"], "InterpolationMode", InterpolationMode)
    setattr(mods["torchvision.transforms.functional"], "InterpolationMode", InterpolationMode)
    setattr(mods["torchvision.transforms"], "functional", mods["torchvision.transforms.functional"])
    setattr(mods["torchvision"], "transforms", mods["torchvision.transforms"])
    for n, m in mods.items():
        sys.modules.setdefault(n, m)


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


class Case:
    """A ragged batch over scattered slots of a real SGLang pool, and its decode inputs."""

    def __init__(self, kind: str, *, seed: int, dtype: Any = None) -> None:
        g = torch.Generator().manual_seed(seed)
        self.kind = kind
        # the pool's dtype; the model's exact keys are one precision wider (float32 keys into
        # a float16 pool, float64 keys into a float32 pool)
        self.dtype = torch.float16 if dtype is None else dtype
        wide = torch.float32 if self.dtype == torch.float16 else torch.float64
        self.heads, self.kv_heads, self.d, self.dv = {
            "gqa": (8, 2, 64, 64), "mha": (4, 4, 64, 64), "mla": (4, 1, 576, 512)}[kind]
        self.lens = [37, 1, 20, 70]
        self.splits = torch.tensor([4, 1, 2, 3], dtype=torch.int32)
        self.max_splits = 4
        total = sum(self.lens)
        self.size = total + 9  # spare slots nobody reads
        perm = torch.randperm(self.size, generator=g)[:total] + 1  # slot 0 is SGLang's pad
        self.indices = perm.to(torch.int64)
        self.indptr = torch.tensor([0, *torch.tensor(self.lens).cumsum(0).tolist()],
                                   dtype=torch.int32)
        self.k = torch.randn(total, self.kv_heads, self.d, generator=g, dtype=wide)
        self.k[:, :, 5] *= 8.0  # a massive channel
        self.v = torch.randn(total, self.kv_heads, self.dv, generator=g, dtype=wide)
        self.q = torch.randn(len(self.lens), self.heads, self.d, generator=g).to(self.dtype)
        self.scale = self.d ** -0.5

    def pool(self, mp: Any) -> Any:
        if self.kind == "mla":
            return mp.MLATokenToKVPool(size=self.size, page_size=1, dtype=self.dtype,
                                       kv_lora_rank=512, qk_rope_head_dim=64, layer_num=2,
                                       device="cpu", enable_memory_saver=False)
        return mp.MHATokenToKVPool(size=self.size, page_size=1, dtype=self.dtype,
                                   head_num=self.kv_heads, head_dim=self.d, layer_num=2,
                                   device="cpu", enable_memory_saver=False)

    def write(self, pool: Any, layer: int) -> None:
        lay = types.SimpleNamespace(layer_id=layer)
        if self.kind == "mla":
            pool.set_kv_buffer(lay, self.indices, self.k, None)
        else:
            pool.set_kv_buffer(lay, self.indices, self.k, self.v)

    def buffers(self, pool: Any, layer: int) -> tuple[Any, Any]:
        if self.kind == "mla":
            kv = pool.kv_buffer[layer]
            return kv, kv[..., :self.dv]
        return pool.k_buffer[layer], pool.v_buffer[layer]

    def decode(self, dec: Any, pool: Any, layer: int) -> tuple[Any, Any]:
        k_buf, v_buf = self.buffers(pool, layer)
        bsz = len(self.lens)
        o = torch.zeros(bsz, self.heads, self.dv, dtype=self.dtype)
        logits = torch.zeros(bsz, self.heads, self.max_splits, self.dv, dtype=torch.float32)
        lse = torch.zeros(bsz, self.heads, self.max_splits, dtype=torch.float32)
        # the interpreter evaluates masked lanes (-inf - -inf) with numpy, which would warn
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            dec.decode_attention_fwd(self.q, k_buf, v_buf, o, self.indptr, self.indices, logits,
                                     lse, self.splits, self.max_splits, self.scale, 1.0, 1.0,
                                     has_mla=self.kind == "mla")
        return o, lse

    def reference(self, pool: Any, layer: int) -> tuple[Any, Any]:
        """Per (request, head): the torch meter on the kernel's attention (fp16 keys as
        stored, float64 logits) and the exact TV against attention on the exact keys."""
        k_buf, _ = self.buffers(pool, layer)
        group = self.heads // self.kv_heads
        meter = torch.zeros(len(self.lens), self.heads, dtype=torch.float64)
        tv = torch.zeros_like(meter)
        w_all = runtime.active()
        assert w_all is not None
        wit = w_all.witness_of(k_buf)
        assert wit is not None
        for b, n in enumerate(self.lens):
            lo = int(self.indptr[b])
            sl = self.indices[lo:lo + n]
            for h in range(self.heads):
                kv = h // group
                qh = self.q[b, h].double()
                s_hat = (k_buf[sl, kv].double() @ qh) * self.scale
                s = (self.k[lo:lo + n, kv].double() @ qh) * self.scale
                p_hat, p = torch.softmax(s_hat, 0), torch.softmax(s, 0)
                lb = logit_bound(qh, wit[sl, kv].double(), scale=self.scale,
                                 layout=ON.layout)
                meter[b, h] = tv_bounds_batch(p_hat, lb, visible=torch.tensor(n)).meter
                tv[b, h] = 0.5 * (p - p_hat).abs().sum()
        return meter, tv


class ExtCase:
    """A prefill batch over a real SGLang pool: ragged prefix lengths (some 0) at scattered
    slots, ragged chunks whose keys the pool stores and the kernel reads from ``k_extend``."""

    def __init__(self, kind: str, *, seed: int, dtype: Any = None) -> None:
        g = torch.Generator().manual_seed(seed)
        self.dtype = torch.float16 if dtype is None else dtype
        wide = torch.float32 if self.dtype == torch.float16 else torch.float64
        self.heads, self.kv_heads, self.d = {"gqa": (8, 2, 64), "mha": (4, 4, 64)}[kind]
        self.pre, self.ext = [5, 0, 30, 0], [7, 3, 1, 20]
        n_pre, n_ext = sum(self.pre), sum(self.ext)
        self.size = n_pre + n_ext + 9
        perm = torch.randperm(self.size, generator=g) + 1  # slot 0 is SGLang's pad
        self.kv_indices = perm[:n_pre].to(torch.int64)
        self.out_loc = perm[n_pre:n_pre + n_ext].to(torch.int64)
        self.kv_indptr = torch.tensor([0, *torch.tensor(self.pre).cumsum(0).tolist()],
                                      dtype=torch.int32)
        self.qo_indptr = torch.tensor([0, *torch.tensor(self.ext).cumsum(0).tolist()],
                                      dtype=torch.int32)
        self.k_pre = torch.randn(n_pre, self.kv_heads, self.d, generator=g, dtype=wide)
        self.k_pre[:, :, 5] *= 8.0  # a massive channel
        self.v_pre = torch.randn(n_pre, self.kv_heads, self.d, generator=g, dtype=wide)
        # the chunk's fresh keys in the query's dtype (the kernel's dot takes one dtype)
        self.k_ext = torch.randn(n_ext, self.kv_heads, self.d, generator=g).to(self.dtype)
        self.v_ext = torch.randn(n_ext, self.kv_heads, self.d, generator=g).to(self.dtype)
        self.q = torch.randn(n_ext, self.heads, self.d, generator=g).to(self.dtype)
        self.scale = self.d ** -0.5

    def pool(self, mp: Any) -> Any:
        return mp.MHATokenToKVPool(size=self.size, page_size=1, dtype=self.dtype,
                                   head_num=self.kv_heads, head_dim=self.d, layer_num=2,
                                   device="cpu", enable_memory_saver=False)

    def write(self, pool: Any, layer: int) -> None:
        """The earlier steps' prefix keys, then this step's chunk (as the backend does)."""
        lay = types.SimpleNamespace(layer_id=layer)
        pool.set_kv_buffer(lay, self.kv_indices, self.k_pre, self.v_pre)
        pool.set_kv_buffer(lay, self.out_loc, self.k_ext, self.v_ext)

    def extend(self, ext: Any, pool: Any, layer: int, **kw: Any) -> Any:
        k_buf, v_buf = pool.k_buffer[layer], pool.v_buffer[layer]
        o = torch.zeros(len(self.q), self.heads, self.d, dtype=self.dtype)
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            ext.extend_attention_fwd(
                self.q, kw.pop("k_extend", self.k_ext), self.v_ext, o, k_buf, v_buf,
                self.qo_indptr, self.kv_indptr, self.kv_indices, kw.pop("custom_mask", None),
                True, None, max(self.ext), kw.pop("k_scale", 1.0), 1.0, sm_scale=self.scale,
                **kw)
        return o

    def reference(self, pool: Any, layer: int) -> tuple[Any, Any]:
        """Per (token, head): the torch meter on the kernel's causal softmax (prefix keys as
        stored with their witnesses, the chunk's keys with c = 0) and the exact TV against
        the uncompressed prefix keys."""
        k_buf = pool.k_buffer[layer]
        rec = runtime.active()
        assert rec is not None
        wit = rec.witness_of(k_buf)
        assert wit is not None
        group = self.heads // self.kv_heads
        meter = torch.zeros(len(self.q), self.heads, dtype=torch.float64)
        tv = torch.zeros_like(meter)
        for b, (np_, ne) in enumerate(zip(self.pre, self.ext, strict=True)):
            lo, qlo = int(self.kv_indptr[b]), int(self.qo_indptr[b])
            sl = self.kv_indices[lo:lo + np_]
            for j in range(ne):
                t = qlo + j
                chunk = self.k_ext[qlo:t + 1]
                for h in range(self.heads):
                    kv = h // group
                    qh = self.q[t, h].double()
                    k_hat = torch.cat([k_buf[sl, kv].double(), chunk[:, kv].double()])
                    k_true = torch.cat([self.k_pre[lo:lo + np_, kv].double(),
                                        chunk[:, kv].double()])
                    p_hat = torch.softmax((k_hat @ qh) * self.scale, 0)
                    p = torch.softmax((k_true @ qh) * self.scale, 0)
                    w = torch.cat([wit[sl, kv].double(),
                                   torch.zeros(j + 1, BANDS, dtype=torch.float64)])
                    lb = logit_bound(qh, w, scale=self.scale, layout=ON.layout)
                    meter[t, h] = tv_bounds_batch(p_hat, lb,
                                                  visible=torch.tensor(np_ + j + 1)).meter
                    tv[t, h] = 0.5 * (p - p_hat).abs().sum()
        return meter, tv


@contextmanager
def _engine_import() -> Generator[None]:
    # SGLang's import-time deprecation warnings are the engine's, not this adapter's
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


@pytest.fixture(scope="module")
def sgl() -> Iterator[dict[str, Any]]:
    with _engine_import():
        importlib.import_module("sglang")  # transformers records torchvision's absence first
        _torchvision_stand_in()
        from sglang.srt.runtime_context import get_parallel
        parallel: Any = get_parallel()
        parallel.override_permanently(dcp_enabled=False)
        dec = importlib.import_module("sglang.kernels.ops.attention.decode_attention")
        ext = importlib.import_module("sglang.kernels.ops.attention.extend_attention")
        mp = importlib.import_module("sglang.srt.mem_cache.memory_pool")
    root = inst.sglang_root()
    files = [root / inst.DECODE, root / inst.POOL, root / inst.EXTEND]
    assert all(active_patches(f) == () for f in files)
    before = [_sha(f) for f in files]
    # the pristine kernels' outputs, before any patch
    pristine = {}
    for kind in ("gqa", "mha", "mla"):
        c = Case(kind, seed=7)
        pool = c.pool(mp)
        c.write(pool, 1)
        pristine[kind] = c.decode(dec, pool, 1)
    for kind in ("gqa", "mha"):
        e = ExtCase(kind, seed=7)
        pool = e.pool(mp)
        e.write(pool, 1)
        pristine["extend " + kind] = e.extend(ext, pool, 1)
    done = inst.install(radix_cache=False, generation_checks=False)
    try:
        assert [active_patches(f) for f in files] == [(inst.OWNER,)] * 3
        with _engine_import():
            dec = importlib.reload(dec)
            ext = importlib.reload(ext)
            mp = importlib.reload(mp)
        yield {"dec": dec, "ext": ext, "mp": mp, "pristine": pristine, "files": files,
               "before": before}
    finally:
        done.revert()
        with _engine_import():
            importlib.reload(dec)
            importlib.reload(ext)
            importlib.reload(mp)
        for n in TV_NAMES:
            sys.modules.pop(n, None)
    assert [_sha(f) for f in files] == before  # byte-identical restore


def test_every_anchor_matches_the_installed_source_and_a_changed_block_fails() -> None:
    root = inst.sglang_root()
    for rel, anchors in ((inst.DECODE, inst.decode_anchors()), (inst.POOL, inst.pool_anchors()),
                         (inst.EXTEND, inst.extend_anchors())):
        text = (root / rel).read_text()
        if active_patches(root / rel):
            continue
        patched = apply_anchors(text, anchors, source=rel)
        assert "_witcert_rt" in patched and patched != text
    text = (root / inst.DECODE).read_text()
    changed = text.replace("qk = tl.where(offs_n < split_kv_end, qk",
                           "qk = tl.where(offs_n <= split_kv_end, qk")
    with pytest.raises(InjectionError, match=r"anchor 'MHA meter block' found 0 times, expected 1"):
        apply_anchors(changed, inst.decode_anchors(), source=inst.DECODE)
    text = (root / inst.EXTEND).read_text()
    if not active_patches(root / inst.EXTEND):
        changed = text.replace("cur_seq_len_prefix + start_n + offs_n[None, :],",
                               "cur_seq_len_prefix + start_n + 1 + offs_n[None, :],")
        with pytest.raises(InjectionError,
                           match=r"anchor 'extend chunk meter block' found 0 times, expected 1"):
            apply_anchors(changed, inst.extend_anchors(), source=inst.EXTEND)


def test_the_switch_is_read_once_and_validated() -> None:
    assert load({}).enabled is False and load({"WITCERT_SGLANG": "0"}).enabled is False
    assert load({"WITCERT_SGLANG": "1"}).enabled is True
    with pytest.raises(InvalidValueError, match="WITCERT_SGLANG"):
        load({"WITCERT_SGLANG": "yes"})
    with pytest.raises(InvalidValueError, match="bands"):
        SGLangConfig(enabled=True, bands=0)


def test_the_installer_refuses_a_radix_cache_without_generation_checks(tmp_path: Path) -> None:
    with pytest.raises(EngineMismatchError, match="radix cache.*no generation checks"):
        inst.install(radix_cache=True, generation_checks=False, root=tmp_path)
    assert list(tmp_path.iterdir()) == []  # nothing was touched


FILES = (inst.DECODE, inst.EXTEND, inst.POOL)  # the installer's order


def _sglang_copy(tmp_path: Path) -> Path:
    """The installed SGLang's three patched files, pristine, copied under a ``sglang`` folder."""
    root = inst.sglang_root()
    if any(active_patches(root / f) for f in FILES):
        pytest.skip("the installed SGLang files carry a patch now (another run's fixture)")
    base = tmp_path / "sglang"
    for f in FILES:
        (base / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / f, base / f)
    return base


def _state(base: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under ``base`` (manifests and temporary files included): bytes, mtime."""
    return {str(p.relative_to(base)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(base.rglob("*")) if p.is_file()}


def test_a_broken_anchor_in_the_last_file_writes_no_byte_of_any(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every anchor of every file is checked before any byte is written: the last anchor of
    the third file changed upstream leaves all three files (and their folders) as they were,
    and no write of any kind was made, not even one rolled back."""
    base = _sglang_copy(tmp_path)
    last = inst.pool_anchors()[-1]
    pool = base / inst.POOL
    pool.write_bytes(pool.read_bytes().replace(last.old.encode(),
                                               last.old[:-1].encode() + b"  # changed\n"))
    before = _state(base)
    writes: list[str] = []
    real_replace, real_bytes, real_text = os.replace, Path.write_bytes, Path.write_text

    def replace(src: Any, dst: Any) -> None:
        writes.append(f"replace {dst}")
        real_replace(src, dst)

    def write_bytes(self: Path, data: Any) -> int:
        writes.append(f"write_bytes {self}")
        return real_bytes(self, data)

    def write_text(self: Path, data: str, *args: Any, **kwargs: Any) -> int:
        writes.append(f"write_text {self}")
        return real_text(self, data, *args, **kwargs)

    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(Path, "write_bytes", write_bytes)
    monkeypatch.setattr(Path, "write_text", write_text)
    with pytest.raises(InjectionError, match=rf"memory_pool.py: anchor '{last.name}' found 0"):
        inst.install(radix_cache=False, generation_checks=False, root=base)
    monkeypatch.undo()
    assert writes == []
    assert _state(base) == before


@pytest.mark.parametrize("crash, then", [("install", "install"), ("install", "uninstall"),
                                         ("uninstall", "uninstall")])
def test_a_crash_between_a_file_and_its_manifest_is_repaired_by_the_next_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, crash: str, then: str) -> None:
    """``os.replace`` (and unlink) fail for good right after the first file is replaced (the
    process dies there): the file is written, its manifest does not record it yet (a journal entry
    does). The next install completes the install; the next uninstall restores every file
    byte for byte and leaves no manifest, journal or temporary file behind."""
    base = _sglang_copy(tmp_path)
    files = [base / f for f in FILES]
    pristine = _state(base)
    if crash == "uninstall":
        inst.install(radix_cache=False, generation_checks=False, root=base)
    real_replace = os.replace
    replaced: list[Path] = []

    def dying(src: Any, dst: Any) -> None:
        if replaced:
            raise OSError("simulated crash")
        real_replace(src, dst)
        if Path(dst) in files:
            replaced.append(Path(dst))

    real_unlink = Path.unlink

    def dying_unlink(self: Path, missing_ok: bool = False) -> None:
        # the last patch of a folder reverted removes the manifest instead of replacing it
        if replaced:
            raise OSError("simulated crash")
        real_unlink(self, missing_ok=missing_ok)

    monkeypatch.setattr(os, "replace", dying)
    monkeypatch.setattr(Path, "unlink", dying_unlink)
    with pytest.raises(OSError, match="simulated crash"):
        if crash == "install":
            inst.install(radix_cache=False, generation_checks=False, root=base)
        else:
            inst.installed(root=base).revert()
    monkeypatch.undo()
    (first,) = replaced
    manifest = json.loads((first.parent / MANIFEST).read_text())
    assert manifest[first.name]["pending"]["op"] == {"install": "apply",
                                                     "uninstall": "revert"}[crash]
    assert ("witcert" in first.read_text()) == (crash == "install")
    if then == "install":
        done = inst.install(radix_cache=False, generation_checks=False, root=base)
        assert [active_patches(f) for f in files] == [(inst.OWNER,)] * 3
        assert all("_witcert_rt" in f.read_text() for f in files)
        assert all("pending" not in v for f in files
                   for v in json.loads((f.parent / MANIFEST).read_text()).values())
        done.revert()
    else:
        inst.installed(root=base).revert()
    after = _state(base)
    assert sorted(after) == sorted(pristine)  # no manifest, journal or temporary file left
    assert {k: v[0] for k, v in after.items()} == {k: v[0] for k, v in pristine.items()}


def test_switch_off_kernels_are_bit_identical_to_upstream(sgl: dict[str, Any]) -> None:
    assert runtime.active() is None
    for kind, val in sgl["pristine"].items():
        if kind.startswith("extend "):
            e = ExtCase(kind.removeprefix("extend "), seed=7)
            pool = e.pool(sgl["mp"])
            e.write(pool, 1)
            assert torch.equal(e.extend(sgl["ext"], pool, 1), val), kind
            continue
        o0, lse0 = val
        c = Case(kind, seed=7)
        pool = c.pool(sgl["mp"])
        c.write(pool, 1)
        o, lse = c.decode(sgl["dec"], pool, 1)
        assert torch.equal(o, o0) and torch.equal(lse, lse0), kind


def test_a_second_owner_patches_the_same_file_and_reverts_in_either_order(
        sgl: dict[str, Any]) -> None:
    path = sgl["files"][0]
    with_meter = _sha(path)
    other = (Anchor("second owner", "def tanh(x):\n", "def tanh(x):  # second owner\n"),)
    for order in ("second-first", "meter-first"):
        p2 = patch_file(path, other, owner="second")
        assert active_patches(path) == (inst.OWNER, "second")
        if order == "second-first":
            p2.revert()
            assert _sha(path) == with_meter
        else:
            inst.installed().patches[0].revert()
            assert active_patches(path) == ("second",)
            assert "_witcert_rt" not in path.read_text()
            p2.revert()
            assert _sha(path) == sgl["before"][0]
            patch_file(path, inst.decode_anchors(), owner=inst.OWNER)  # the fixture's again
            assert _sha(path) == with_meter


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("kind", ["gqa", "mha", "mla"])
def test_the_meter_inside_sglang_kernels_matches_the_torch_meter(sgl: dict[str, Any],
                                                                  kind: str, dtype: str) -> None:
    c = Case(kind, seed=11, dtype=getattr(torch, dtype))
    with runtime.metering(ON) as rec:
        assert rec is not None
        pool = c.pool(sgl["mp"])
        c.write(pool, 0)
        c.write(pool, 1)
        k_buf, _ = c.buffers(pool, 1)
        wit = rec.witness_of(k_buf)
        assert wit is not None
        # the pool's write path produced the witnesses of the keys as it stored them
        want = witness_write(c.k, k_buf[c.indices].to(c.k.dtype), bands=BANDS, layout=ON.layout)
        assert torch.equal(wit[c.indices], want)
        unread = torch.ones(int(wit.shape[0]), dtype=torch.bool)
        unread[c.indices] = False
        assert bool(torch.isinf(wit[unread]).all())  # never written: +inf, not 0
        o, _ = c.decode(sgl["dec"], pool, 1)
        ref, tv = c.reference(pool, 1)
        (launch,) = rec.launches
        got = launch.bounds()
    o0, _ = sgl["pristine"][kind]
    assert o.shape == o0.shape and bool(torch.isfinite(o).all())
    rel = ((got.meter - ref).abs() / ref.clamp(min=1e-300)).max()
    print(f"{kind} {dtype}: max relative error of the kernel's meter vs the torch meter "
          f"{float(rel):.2e}"
          f", largest meter {float(got.meter.max()):.3e}, largest exact TV {float(tv.max()):.3e}")
    assert float(rel) < 1e-3, float(rel)
    assert bool((got.meter >= tv).all())  # sound per (request, head)
    assert bool((got.meter[1] == 0).all())  # one token: exactly 0
    assert bool((got.meter[[0, 2, 3]] > 0).all())


def test_the_bound_holds_when_the_query_aligns_with_the_residuals(sgl: dict[str, Any]) -> None:
    c = Case("gqa", seed=5)
    with runtime.metering(ON) as rec:
        assert rec is not None
        pool = c.pool(sgl["mp"])
        c.write(pool, 1)
        k_buf, _ = c.buffers(pool, 1)
        # each query points along the storage residual of its request's first token,
        # scaled up so that the rounding error moves attention as much as it can
        for b in range(len(c.lens)):
            lo = int(c.indptr[b])
            r = (k_buf[c.indices[lo]].double() - c.k[lo].double())  # [kv_heads, d]
            for h in range(c.heads):
                kv = h // (c.heads // c.kv_heads)
                c.q[b, h] = (r[kv] / r[kv].norm() * 60.0 + 0.01 * c.k[lo, kv]).half()
        c.decode(sgl["dec"], pool, 1)
        _, tv = c.reference(pool, 1)
        got = rec.launches[0].bounds()
    print(f"adversarial: largest exact TV {float(tv.max()):.3e}, meter there "
          f"{float(got.meter.flatten()[tv.argmax()]):.3e}")
    assert float(tv.max()) > 1e-4
    assert bool((got.meter >= tv).all())


def test_readings_enter_the_ledger_and_the_gate_sees_an_unwritten_layer(
        sgl: dict[str, Any]) -> None:
    c = Case("mha", seed=3)
    c.lens, c.splits = [12, 9], torch.tensor([2, 1], dtype=torch.int32)
    c.indptr = torch.tensor([0, 12, 21], dtype=torch.int32)
    c.indices, c.k, c.v = c.indices[:21], c.k[:21], c.v[:21]
    c.q = c.q[:2]
    accounts = Accounts(layers=2, seats=4, tau=0.5, audit=False, delta_req=Fraction(1, 100),
                        session="t", kv_cache_dtype="float16")
    with runtime.metering(ON) as rec:
        assert rec is not None
        pool = c.pool(sgl["mp"])
        good = [accounts.tally("a"), accounts.tally("b")]
        for _ in range(3):  # three steps, both layers written and read
            c.write(pool, 0)
            c.write(pool, 1)
            c.decode(sgl["dec"], pool, 0)
            c.decode(sgl["dec"], pool, 1)
            cells = rec.flush(accounts, good, layers=2)
            assert len(cells) == 2 * 2 * c.heads
            assert {(x.layer, x.head) for x in cells} == {(la, h) for la in (0, 1)
                                                          for h in range(c.heads)}
            assert all(x.reading.tier.name == "CERTIFIED" for x in cells)
        verdict = accounts.finish("a")
        assert verdict is not None and verdict.tier == "CERTIFIED"
        assert verdict.spent == "0" and verdict.steps == 3 and verdict.cells == 3 * 2 * c.heads
        # coverage and magnitude pass; soundness is "not audited" (so nothing failed)
        stages = verdict.gate["stages"]
        assert stages["coverage"]["passed"] and stages["magnitude"]["passed"]
        assert verdict.gate["failed_stage"] is None
        accounts.finish("b")
        # a fresh pool whose layer 0 never had its witness written
        pool2 = c.pool(sgl["mp"])
        bad = [accounts.tally("c"), accounts.tally("d")]
        c.write(pool2, 1)
        c.decode(sgl["dec"], pool2, 0)  # unwitnessed: launched as upstream, not metered
        c.decode(sgl["dec"], pool2, 1)
        assert rec.unwitnessed_reads == 1
        rec.flush(accounts, bad, layers=2)
        v2 = accounts.finish("c")
        assert v2 is not None and not v2.gate["accepted"]
        assert v2.gate["failed_stage"] == "coverage"
        assert "layer" in v2.gate["stages"]["coverage"]["detail"]


def test_an_unwitnessed_slot_saturates_rather_than_reads_exact(sgl: dict[str, Any]) -> None:
    c = Case("gqa", seed=9)
    with runtime.metering(ON) as rec:
        assert rec is not None
        pool = c.pool(sgl["mp"])
        c.write(pool, 1)
        k_buf, _ = c.buffers(pool, 1)
        wit = rec.witness_of(k_buf)
        assert wit is not None
        wit[c.indices[int(c.indptr[3]) + 4]] = math.inf  # as if that slot was never written
        c.decode(sgl["dec"], pool, 1)
        got = rec.launches[0].bounds()
    assert bool(torch.isinf(got.log_a[3]).all()) and bool((got.meter[3] >= 1).all())
    assert bool(torch.isfinite(got.meter[0]).all())


def test_a_nan_witness_never_reads_as_exact_inside_sglang(sgl: dict[str, Any]) -> None:
    """Triton's max and min skip NaN: a slot's witnesses ``[nan, 0, ..., 0]`` once read as an
    exact key inside SGLang's kernel (``c = 0``, no flag). Its request's rows are NaN and the
    evidence is refused; the other requests' rows stay finite."""
    from witcert_calculus.errors import PremiseError
    from witcert_calculus.lean.theorems import TV_EFORM_METER_SOUND

    c = Case("gqa", seed=9)
    with runtime.metering(ON) as rec:
        assert rec is not None
        pool = c.pool(sgl["mp"])
        c.write(pool, 1)
        k_buf, _ = c.buffers(pool, 1)
        wit = rec.witness_of(k_buf)
        assert wit is not None
        slot = c.indices[int(c.indptr[3]) + 4]
        wit[slot] = 0.0
        wit[slot, :, 0] = math.nan
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "All-NaN slice encountered", RuntimeWarning)
            c.decode(sgl["dec"], pool, 1)
        got = rec.launches[0].bounds()
    assert bool(torch.isnan(got.meter[3]).all()), got.meter[3]
    assert bool(torch.isfinite(got.meter[:3]).all())
    with pytest.raises(PremiseError):
        got.basis.evidence(TV_EFORM_METER_SOUND)


def test_logits_the_witnesses_do_not_bound_are_refused(sgl: dict[str, Any]) -> None:
    c = Case("mha", seed=1)
    with runtime.metering(ON):
        pool = c.pool(sgl["mp"])
        c.write(pool, 1)
        k_buf, v_buf = c.buffers(pool, 1)
        o = torch.zeros(4, c.heads, c.dv, dtype=torch.float16)
        logits = torch.zeros(4, c.heads, 4, c.dv)
        lse = torch.zeros(4, c.heads, 4)
        with pytest.raises(EngineMismatchError, match="logit_cap=30.0"):
            sgl["dec"].decode_attention_fwd(c.q, k_buf, v_buf, o, c.indptr, c.indices, logits,
                                            lse, c.splits, 4, c.scale, 1.0, 1.0, logit_cap=30.0)
        with pytest.raises(EngineMismatchError, match="attention sinks"):
            sgl["dec"].decode_attention_fwd(c.q, k_buf, v_buf, o, c.indptr, c.indices, logits,
                                            lse, c.splits, 4, c.scale, 1.0, 1.0,
                                            sinks=torch.zeros(c.heads))
        with pytest.raises(EngineMismatchError, match="a key scale"):
            pool.set_kv_buffer(types.SimpleNamespace(layer_id=1), c.indices, c.k.clone(),
                               c.v.clone(), k_scale=2.0)
        with pytest.raises(EngineMismatchError, match="the decode query"):
            sgl["dec"].decode_attention_fwd(c.q.float(), k_buf, v_buf, o, c.indptr, c.indices,
                                            logits, lse, c.splits, 4, c.scale, 1.0, 1.0)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("kind", ["gqa", "mha"])
def test_the_meter_inside_the_extend_kernel_matches_the_torch_meter(
        sgl: dict[str, Any], kind: str, dtype: str) -> None:
    e = ExtCase(kind, seed=13, dtype=getattr(torch, dtype))
    with runtime.metering(ON) as rec:
        assert rec is not None
        pool = e.pool(sgl["mp"])
        e.write(pool, 1)
        o = e.extend(sgl["ext"], pool, 1)
        ref, tv = e.reference(pool, 1)
        (launch,) = rec.launches
        assert isinstance(launch, runtime.ExtendLaunch)
        got = launch.bounds()
    assert bool(torch.isfinite(o).all())
    rel = ((got.meter - ref).abs() / ref.clamp(min=1e-300)).max()
    print(f"extend {kind} {dtype}: max relative error of the kernel's meter vs the torch meter "
          f"{float(rel):.2e}, largest meter {float(got.meter.max()):.3e}, largest exact TV "
          f"{float(tv.max()):.3e}")
    assert float(rel) < 1e-3, float(rel)
    assert bool((got.meter >= tv).all())  # sound per (token, head)
    # request 1 has no prefix: its keys are all the chunk's own (c = 0), so it reads exact
    lo, hi = int(e.qo_indptr[1]), int(e.qo_indptr[2])
    assert bool((got.meter[lo:hi] == 0).all()) and bool((got.log_a[lo:hi] == 0).all())
    # request 3 has no prefix either; requests 0 and 2 read compressed prefix keys
    lo3 = int(e.qo_indptr[3])
    assert bool((got.meter[lo3:] == 0).all())
    assert bool((got.meter[:int(e.qo_indptr[1])] > 0).all())
    assert bool((got.meter[int(e.qo_indptr[2]):lo3] > 0).all())


def test_the_extend_bound_holds_when_the_query_aligns_with_the_residuals(
        sgl: dict[str, Any]) -> None:
    e = ExtCase("gqa", seed=5)
    with runtime.metering(ON) as rec:
        assert rec is not None
        pool = e.pool(sgl["mp"])
        e.write(pool, 1)
        k_buf = pool.k_buffer[1]
        # request 2's queries point along the storage residual of its first prefix token
        lo, t = int(e.kv_indptr[2]), int(e.qo_indptr[2])
        r = k_buf[e.kv_indices[lo]].double() - e.k_pre[lo].double()
        for h in range(e.heads):
            kv = h // (e.heads // e.kv_heads)
            e.q[t, h] = (r[kv] / r[kv].norm() * 60.0 + 0.01 * e.k_pre[lo, kv]).half()
        e.extend(sgl["ext"], pool, 1)
        _, tv = e.reference(pool, 1)
        launch = rec.launches[0]
        got = launch.bounds()
    print(f"extend adversarial: largest exact TV {float(tv.max()):.3e}, meter there "
          f"{float(got.meter.flatten()[tv.argmax()]):.3e}")
    assert float(tv.max()) > 1e-4
    assert bool((got.meter >= tv).all())


def test_extend_launches_fold_into_the_step_readings(sgl: dict[str, Any]) -> None:
    e = ExtCase("mha", seed=3)
    accounts = Accounts(layers=2, seats=4, tau=0.5, audit=False, delta_req=Fraction(1, 100),
                        session="t", kv_cache_dtype="float16")
    with runtime.metering(ON) as rec:
        assert rec is not None
        pool = e.pool(sgl["mp"])
        tallies = [accounts.tally(n) for n in "abcd"]
        e.write(pool, 0)
        e.write(pool, 1)
        e.extend(sgl["ext"], pool, 0)
        e.extend(sgl["ext"], pool, 1)
        per_token = [launch.bounds().meter for launch in rec.launches]
        cells = rec.flush(accounts, tallies, layers=2)
    assert {(x.layer, x.head) for x in cells} == {(la, h) for la in (0, 1)
                                                  for h in range(e.heads)}
    assert len(cells) == 2 * 4 * e.heads
    for x in cells:  # each request's cell is its worst token of that layer and head
        lo, hi = int(e.qo_indptr[x.request]), int(e.qo_indptr[x.request + 1])
        assert x.reading.value == float(per_token[x.layer][lo:hi, x.head].max())
    v = accounts.finish("a")
    assert v is not None and v.gate["stages"]["coverage"]["passed"]


def test_extend_paths_the_meter_does_not_follow_are_refused(sgl: dict[str, Any]) -> None:
    e = ExtCase("mha", seed=1)
    with runtime.metering(ON):
        pool = e.pool(sgl["mp"])
        e.write(pool, 1)
        for kw, what in (({"logit_cap": 30.0}, "logit_cap=30.0"),
                         ({"sinks": torch.zeros(e.heads)}, "sinks=set"),
                         ({"sliding_window_size": 4}, "sliding_window_size=4"),
                         ({"custom_mask": torch.ones(8, dtype=torch.uint8)}, "custom_mask=set"),
                         ({"skip_prefix": True}, "skip_prefix=True"),
                         ({"k_scale": 0.5}, "k_scale=0.5")):
            with pytest.raises(EngineMismatchError, match=what):
                e.extend(sgl["ext"], pool, 1, **kw)
        # the backend's read-back path: the chunk's keys are the pool's compressed copies
        # of wider keys, with no write of them in this step
        wide = e.k_ext.float() + 1e-3 * torch.randn(e.k_ext.shape,
                                                    generator=torch.Generator().manual_seed(2))
        pool.set_kv_buffer(types.SimpleNamespace(layer_id=1), e.out_loc, wide, e.v_ext)
        pool.set_kv_buffer(types.SimpleNamespace(layer_id=1), e.kv_indices, e.k_pre, e.v_pre)
        with pytest.raises(EngineMismatchError, match="the extend chunk's keys"):
            e.extend(sgl["ext"], pool, 1, k_extend=pool.k_buffer[1][e.out_loc])
        # the base-2 mode (AMD gfx950 only, never on this path): refused at the launch
        with pytest.raises(EngineMismatchError, match="use_exp2=True"):
            runtime.extend_args(e.q, e.k_ext, pool.k_buffer[1], e.qo_indptr, e.kv_indptr, 1.0,
                                1.0, is_causal=True, logit_cap=0.0, xai_temperature_len=-1,
                                score_mod=None, custom_mask=None, sliding_window_size=-1,
                                sinks=None, skip_prefix=False, skip_extend=False, page_size=1,
                                use_exp2=True)
        with pytest.raises(EngineMismatchError, match="the unified extend kernel"):
            sgl["ext"].extend_attention_fwd_unified(
                e.q, torch.zeros_like(e.q), pool.k_buffer[1], pool.v_buffer[1], 1.0, 1.0,
                e.qo_indptr, e.kv_indptr, e.kv_indices, torch.tensor(e.pre), max(e.ext))
        with pytest.raises(EngineMismatchError, match="the dense prefill kernel"):
            sgl["ext"].dense_prefill_attention_fwd(
                e.q, e.k_ext, e.v_ext, torch.zeros_like(e.q), e.qo_indptr, e.qo_indptr,
                max(e.ext))
