"""The meter's Triton pieces that SGLang's patched kernels call (:mod:`witcert_adapters.sglang.
triton_meter`), driven by a small kernel of their own in Triton's interpreter: a NaN witness or
query band norm never reads as exact, whichever entries it shares a reduction with.

SGLang's own patched kernels call exactly these functions (``meter_init``, ``meter_block``,
``meter_store``); tests/adapters/test_sglang.py runs them inside SGLang.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from witcert_adapters.sglang.triton_meter import bounds_from_partials, empty_partials, \
    meter_block, meter_constants, meter_init, meter_store  # noqa: E402
from witcert_calculus.errors import PremiseError  # noqa: E402
from witcert_calculus.lean.theorems import TV_EFORM_METER_SOUND  # noqa: E402

R, N, NB = 4, 16, 4  # query heads (one kv head), tokens, bands


@triton.jit
def _one_block(WitQn: Any, Wit: Any, WitC: Any, WitOut: Any, S: Any, Loc: Any, n: Any,
               R: tl.constexpr, N: tl.constexpr, NB: tl.constexpr) -> None:  # noqa: N803
    heads = tl.arange(0, R)
    mask_h = heads < R
    (qn, mx0, a0, mx1, a1, mx2, a2, s_abs, c_max, c_inf, w_min, bad) = meter_init(
        WitQn, 0, heads, mask_h, R, NB, NB)
    offs = tl.arange(0, N)
    valid_n = offs < n
    valid = mask_h[:, None] & valid_n[None, :]
    kv_loc = tl.load(Loc + offs, mask=valid_n, other=0)
    s = tl.load(S + heads[:, None] * N + offs[None, :], mask=valid, other=float("-inf"))
    (qn, mx0, a0, mx1, a1, mx2, a2, s_abs, c_max, c_inf, w_min, bad) = meter_block(
        qn, mx0, a0, mx1, a1, mx2, a2, s_abs, c_max, c_inf, w_min, bad, s, valid, kv_loc,
        valid_n, Wit, 0, NB, NB, NB, WitC, NB)
    meter_store(WitOut, 0, heads, mask_h, 0, R, 1, mx0, a0, mx1, a1, mx2, a2, s_abs, c_max,
                c_inf, w_min, bad)


def _run(qn: torch.Tensor, w: torch.Tensor, s: torch.Tensor, n: int) -> Any:
    out = empty_partials(1, R, 1, device=torch.device("cpu"))
    consts = meter_constants(0.125, NB, device=torch.device("cpu"))
    loc = torch.arange(N, dtype=torch.int64)
    # the interpreter evaluates masked lanes (-inf - -inf) with numpy, which would warn, and
    # reduces with numpy's nanmax, which warns on a slice of NaN only
    with warnings.catch_warnings(), np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        warnings.filterwarnings("ignore", "All-NaN slice encountered", RuntimeWarning)
        _one_block[(1,)](qn, w, consts, out, s, loc, n, R=R, N=N, NB=NB)
    return out, bounds_from_partials(out, qn.view(1, R, NB), torch.tensor([n]), scale=0.125,
                                     tokens=N)


def test_the_pieces_meter_a_clean_block() -> None:
    g = torch.Generator().manual_seed(0)
    qn = torch.rand(R, NB, generator=g, dtype=torch.float64) + 0.5
    w = torch.rand(N, NB, generator=g, dtype=torch.float64) * 0.01
    s = torch.randn(R, N, generator=g)
    _, got = _run(qn, w, s, 12)
    assert bool(torch.isfinite(got.meter).all()) and bool((got.meter > 0).all())
    got.basis.evidence(TV_EFORM_METER_SOUND)


@pytest.mark.parametrize("where", ["band", "token", "head"])
@pytest.mark.parametrize("what", ["witness", "query"])
def test_a_nan_never_reads_as_zero(what: str, where: str) -> None:
    """``[nan, 0, 0, 0]`` once read as exact: ``c_t = 0``, no flag, ``w_min = 0``."""
    g = torch.Generator().manual_seed(1)
    qn = torch.rand(R, NB, generator=g, dtype=torch.float64) + 0.5
    w = torch.rand(N, NB, generator=g, dtype=torch.float64) * 0.01
    s = torch.randn(R, N, generator=g)
    hit = list(range(R))
    if what == "witness":
        rows = slice(0, 12) if where == "head" else slice(3, 4)
        w[rows] = 0.0
        w[rows, slice(None) if where == "token" else 0] = math.nan
    else:
        hit = [1]
        qn[1] = 0.0
        qn[1, slice(None) if where in ("token", "head") else 0] = math.nan
    out, got = _run(qn, w, s, 12)
    for h in hit:
        assert bool(torch.isnan(got.meter[0, h])), got.meter
    if what == "witness":
        assert bool(torch.isnan(out[0, :, 0, 9]).all()), out[0, :, 0, 9]  # w_min
    else:
        assert bool(torch.isfinite(got.meter[0, [0, 2, 3]]).all())
    with pytest.raises(PremiseError):
        got.basis.evidence(TV_EFORM_METER_SOUND)
