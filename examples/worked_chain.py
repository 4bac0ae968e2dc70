"""The storage -> selection chain of attention memory, composed end to end.

Run: ``python examples/worked_chain.py``. Prints each composed contract with its
tier, the same chain through an empirical selector bridge (EMPIRICAL), and the
ill-typed chain (a storage residual fed to a selection stage) being rejected.
"""

from __future__ import annotations

from witcert_calculus import (
    AtConsume,
    AttentionTV,
    Contract,
    KeyResidualAbs,
    MetricMismatchError,
    SelectorMass,
    chain,
    empirical_ratio_bridge,
    rank_prefix_selection,
    score_bridge,
    selector_mass_eform,
    softmax_tv_affine,
    softmax_tv_eform,
    witness_contract,
)

HEAD_DIM = 64
Q_NORM_MAX = 12.0
WITNESS_MAX = 0.02


def storage_to_selection() -> Contract[KeyResidualAbs[AtConsume], AttentionTV[AtConsume]]:
    """Key residual at consumption -> score bridge -> softmax-to-TV -> rank-prefix selection."""
    storage = witness_contract(AtConsume, witness_max=WITNESS_MAX)
    score = score_bridge(AtConsume, scale=HEAD_DIM ** -0.5, q_norm_max=Q_NORM_MAX)
    to_tv = softmax_tv_eform(AtConsume)
    select = rank_prefix_selection(AtConsume, m_out=0.004, m_in=0.002)
    return chain(storage, score, to_tv, select)


def residual_to_selection_affine() -> Contract[KeyResidualAbs[AtConsume], AttentionTV[AtConsume]]:
    """Without the witness, through the affine softmax relaxation (valid on eps <= 0.05 only).

    The score bridge can leave the relaxation's domain, so the composite holds only
    on ``e_in <= 0.05 / 1.5`` and is partially certified.
    """
    score = score_bridge(AtConsume, scale=HEAD_DIM ** -0.5, q_norm_max=Q_NORM_MAX)
    to_tv = softmax_tv_affine(AtConsume, eps0=0.05)
    select = rank_prefix_selection(AtConsume, m_out=0.004, m_in=0.002)
    return score >> to_tv >> select


def through_empirical_selector() -> Contract[KeyResidualAbs[AtConsume], AttentionTV[AtConsume]]:
    """Selector-score mass crosses to attention mass only through a measured ratio."""
    storage = witness_contract(AtConsume, witness_max=WITNESS_MAX)
    score = score_bridge(AtConsume, scale=HEAD_DIM ** -0.5, q_norm_max=Q_NORM_MAX)
    to_mass = selector_mass_eform(AtConsume)
    ratio = empirical_ratio_bridge(SelectorMass[AtConsume], AttentionTV[AtConsume], ratio=1.3,
                                   samples=4096, statistic="p99", set_type="top-64 pages")
    select = rank_prefix_selection(AtConsume, m_out=0.004, m_in=0.002)
    return chain(storage, score, to_mass, ratio, select)


def explained(c: Contract[KeyResidualAbs[AtConsume], AttentionTV[AtConsume]],
              shown: set[str]) -> list[str]:
    """``c.explain()``, its modelling steps already in ``shown`` (printed for an earlier
    chain) named once instead of repeated; adds the steps it prints to ``shown``."""
    lines = c.explain().splitlines()
    steps = {ln for ln in lines if ln.startswith("    - ")}
    kept = [ln for ln in lines if not (ln in steps and ln in shown)]
    if steps and steps <= shown:
        kept[kept.index("  modelled outside Lean:")] = "  modelled outside Lean: as above"
    shown.update(steps)
    return kept


def main() -> None:
    """Print the three chains and the rejected one."""
    shown: set[str] = set()
    for title, c in (("certified chain", storage_to_selection()),
                     ("domain-restricted chain", residual_to_selection_affine()),
                     ("chain through an empirical bridge", through_empirical_selector())):
        name, *rest = explained(c, shown)
        print(f"== {title}, tier {c.tier.name}: {name}")
        print("\n".join(rest))
        if c.subset is not None:
            print(f"  holds on the decidable subset: {c.subset}")
        # A chain that stores the keys starts from the exact ones (e_in = 0); the other starts
        # from a stored residual of at most the witness.
        e_in = 0.0 if c.parts[0].name == "storage witness" else WITNESS_MAX
        print(f"  bound at e_in = {e_in}: {c.bound(e_in)}")
        print()
    print("== ill-typed chain: storage residual -> selection bias")
    storage = witness_contract(AtConsume, witness_max=WITNESS_MAX)
    select = rank_prefix_selection(AtConsume, m_out=0.004, m_in=0.002)
    bad: object = storage
    try:
        chain(bad, select)  # type: ignore[call-overload]  # pyright: ignore
    except MetricMismatchError as err:
        print(f"  rejected at run time: {err}")
    print("  (mypy and pyright reject `storage >> select` before it runs)")


if __name__ == "__main__":
    main()
