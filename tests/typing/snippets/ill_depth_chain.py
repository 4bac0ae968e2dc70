from witcert_calculus import (
    AtConsume,
    HeadSensitivity,
    MlpSensitivity,
    chain,
    mlp_sublayer,
    next_token_head,
    output_projection,
)

mlp = mlp_sublayer(AtConsume, MlpSensitivity(norm_slope=0.5, down_norm=2.0, gate_norm=2.0,
                                             up_norm=2.0, up_max=1.0, act_max=1.0,
                                             gate_reach=10.0))
head = next_token_head(AtConsume, HeadSensitivity(norm_slope=0.5, row_radius=2.0))
proj = output_projection(AtConsume, out_norm=2.0)
good = chain(proj, mlp, head)
bad1 = head >> mlp  # expect-mypy: Unsupported operand types for >> ("Contract[ResidualL2[AtConsume], NextTokenTV[AtConsume]]" and "Contract[ResidualL2[AtConsume], ResidualL2[AtConsume]]")  # expect-pyright: Operator ">>" not supported for types "Contract[ResidualL2[AtConsume], NextTokenTV[AtConsume]]" and "Contract[ResidualL2[AtConsume], ResidualL2[AtConsume]]"
bad2 = proj >> proj  # expect-mypy: Unsupported operand types for >>  # expect-pyright: Operator ">>" not supported for types
