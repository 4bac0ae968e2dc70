from witcert_calculus import AtConsume, chain, witness_contract

s = witness_contract(AtConsume, witness_max=0.02)
chain(s, s, s, s, s, s, s, s, s).bound(0.0)  # expect-mypy: No overload variant of "chain" matches argument types  # expect-mypy: NestChainCallsBeyond8Stages, /, *more: NestChainCallsBeyond8Stages)  # expect-pyright: cannot be assigned to parameter "nest_as_chain_of_chain_c1_to_c8_then_c9" of type "NestChainCallsBeyond8Stages"
