"""Torch references and Triton kernels for witcert-calculus meters (extra ``kernels``).

One torch implementation per formula of the numpy library, with its names, constants,
:class:`~witcert_calculus.meters.witness.RopeLayout` and outward-rounding margins
(:mod:`witcert_calculus.numerics.rounding`).

Main declarations:

- :mod:`witcert_kernels.meter`: band witnesses, logit bound and the Tier-A TV forms,
  checked against :mod:`witcert_calculus.meters.witness` and
  :mod:`witcert_calculus.meters.tv_forms`.
- :mod:`witcert_kernels.dither`: the subtractively dithered INT8 quantizer, bit-identical
  to :mod:`witcert_calculus.meters.dither` (noise stream, scales, codes, values), and the Tier-B
  per-token logit bound.
- :mod:`witcert_kernels.rounding`: the outward-rounding rule on tensors.
- :mod:`witcert_kernels.triton_witness`: the witness write as a Triton kernel, bit-identical
  to :func:`witcert_kernels.meter.band_norms` of the residual rounded up to float32 (imports
  triton; on CPU tensors it runs in Triton's interpreter, ``TRITON_INTERPRET=1``).
"""
