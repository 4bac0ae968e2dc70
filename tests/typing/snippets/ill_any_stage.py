from witcert_calculus import AtConsume, Contract, KeyResidualAbs, Proof, score_bridge

proof = Proof("WitCert.Contract.id_sound")
bare = Contract(KeyResidualAbs, KeyResidualAbs, a=1, b=0, evidence=proof, name="bare")
bad = bare >> score_bridge(AtConsume, scale=0.125, q_norm_max=8.0)  # expect-mypy: Expression type contains "Any"  # expect-pyright: Operator ">>" not supported for types "Contract[KeyResidualAbs[Never], KeyResidualAbs[Never]]"
