from typing_extensions import assert_type

from witcert_calculus import (
    AtConsume,
    AttentionTV,
    Contract,
    KeyResidualAbs,
    chain,
    rank_prefix_selection,
    score_bridge,
    softmax_tv_eform,
    witness_contract,
)

storage = witness_contract(AtConsume, witness_max=0.02)
score = score_bridge(AtConsume, scale=0.125, q_norm_max=8.0)
select = rank_prefix_selection(AtConsume, m_out=0.01, m_in=0.01)
c = chain(storage, score, softmax_tv_eform(AtConsume), select)
assert_type(c, Contract[KeyResidualAbs[AtConsume], AttentionTV[AtConsume]])
d = storage >> score >> softmax_tv_eform(AtConsume) >> select
assert_type(d, Contract[KeyResidualAbs[AtConsume], AttentionTV[AtConsume]])
e = select @ softmax_tv_eform(AtConsume) @ score @ storage
assert_type(e, Contract[KeyResidualAbs[AtConsume], AttentionTV[AtConsume]])
long = chain(storage, storage, storage, score, softmax_tv_eform(AtConsume), select, select, select)
assert_type(long, Contract[KeyResidualAbs[AtConsume], AttentionTV[AtConsume]])
nested = chain(chain(storage, storage, storage, storage, storage, storage, storage, storage),
               score, softmax_tv_eform(AtConsume), select)
assert_type(nested, Contract[KeyResidualAbs[AtConsume], AttentionTV[AtConsume]])
