from typing_extensions import assert_type

from witcert_calculus import AtConsume, Contract, KeyResidualAbs, chain, witness_contract

s = witness_contract(AtConsume, witness_max=0.02)
nine = chain(chain(s, s, s, s, s, s, s, s), s)
assert_type(nine, Contract[KeyResidualAbs[AtConsume], KeyResidualAbs[AtConsume]])
ten = chain(s, chain(s, s, s, s, s, s, s, s), s)
assert_type(ten, Contract[KeyResidualAbs[AtConsume], KeyResidualAbs[AtConsume]])
