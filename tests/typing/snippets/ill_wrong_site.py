from witcert_calculus import AtConsume, AtWrite, score_bridge, witness_contract

storage = witness_contract(AtWrite, witness_max=0.02)
score = score_bridge(AtConsume, scale=0.125, q_norm_max=8.0)
bad = storage >> score  # expect-mypy: Unsupported operand types for >> ("Contract[KeyResidualAbs[AtWrite], KeyResidualAbs[AtWrite]]" and "Contract[KeyResidualAbs[AtConsume], LogitLinf[AtConsume]]")  # expect-pyright: Operator ">>" not supported for types "Contract[KeyResidualAbs[AtWrite], KeyResidualAbs[AtWrite]]"
