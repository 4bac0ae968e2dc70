from witcert_calculus import AtConsume, chain, score_bridge, witness_contract

s = witness_contract(AtConsume, witness_max=0.02)
score = score_bridge(AtConsume, scale=0.125, q_norm_max=8.0)
chain(s, score, s, s, s, s, s, s, s)  # expect-mypy: No overload variant of "chain" matches argument types  # expect-mypy: NestChainCallsBeyond8Stages, /, *more: NestChainCallsBeyond8Stages)  # expect-pyright: cannot be assigned to parameter "nest_as_chain_of_chain_c1_to_c8_then_c9" of type "NestChainCallsBeyond8Stages"
