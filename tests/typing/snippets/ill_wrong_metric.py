from witcert_calculus import AtConsume, chain, rank_prefix_selection, witness_contract

storage = witness_contract(AtConsume, witness_max=0.02)
select = rank_prefix_selection(AtConsume, m_out=0.01, m_in=0.01)
bad1 = storage >> select  # expect-mypy: Unsupported operand types for >> ("Contract[KeyResidualAbs[AtConsume], KeyResidualAbs[AtConsume]]" and "Contract[AttentionTV[AtConsume], AttentionTV[AtConsume]]")  # expect-pyright: Operator ">>" not supported for types "Contract[KeyResidualAbs[AtConsume], KeyResidualAbs[AtConsume]]" and "Contract[AttentionTV[AtConsume], AttentionTV[AtConsume]]"
bad2 = chain(storage, select)  # expect-mypy: Cannot infer value of type parameter "Stage1Out_Stage2In" of "chain"  # expect-pyright: Argument of type "Contract[AttentionTV[AtConsume], AttentionTV[AtConsume]]" cannot be assigned to parameter "c2"
bad3 = select @ storage  # expect-mypy: Unsupported operand types for @  # expect-pyright: Operator "@" not supported for types
bad4 = storage.then(select)  # expect-mypy: Argument 1 to "then" of "Contract" has incompatible type "Contract[AttentionTV[AtConsume], AttentionTV[AtConsume]]"  # expect-pyright: cannot be assigned to parameter "other"
