"""Numbers at the door and at the edge: input checks, exact probabilities, outward rounding.

Main modules:

- :mod:`witcert_calculus.numerics.validation`: every check of a user-supplied value.
- :mod:`witcert_calculus.numerics.probability`:
  :class:`~witcert_calculus.numerics.probability.Probability`, the one exact value type of a failure
  probability, an allowance or a budget.
- :mod:`witcert_calculus.numerics.rounding`: the one outward-rounding rule every float64
  bound is reported by, and its margins.

Rule (``tests/test_layout.py``): the bottom room; it imports only ``errors``.
"""
