"""Independent reference evaluations of the meter formulas, used only by the tests.

- :mod:`reference.golden`: mpmath at 50 digits (the golden values).
- :mod:`reference.exact`: exact ``Fraction`` / sympy arithmetic where the formula is algebraic.
- :mod:`reference.second`: a second implementation in plain Python, written from the
  formulas alone (no numpy, no code shared with the package).
"""
