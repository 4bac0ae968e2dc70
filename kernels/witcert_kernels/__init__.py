"""Triton kernels and torch references for witcert-calculus meters (optional extra ``kernels``).

Main declarations:

- :mod:`witcert_kernels.meter`: torch band witnesses, logit bound and Tier-A TV bounds,
  checked against the numpy meters of :mod:`witcert_calculus.meters`.
- :mod:`witcert_kernels.dither`: torch port of the subtractively dithered INT8 quantizer,
  bit-identical to :mod:`witcert_calculus.dither` (noise stream, scales, codes, values).
"""
