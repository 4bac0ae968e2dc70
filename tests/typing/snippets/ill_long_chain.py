from witcert_calculus import AtConsume, chain, witness_contract

s = witness_contract(AtConsume, witness_max=0.02)
chain(s, s, s, s, s, s, s, s, s).bound(0.0)  # expect-mypy: chain() type-checks up to 8 stages; nest the calls for more  # expect-pyright: chain() type-checks up to 8 stages; nest the calls for more
