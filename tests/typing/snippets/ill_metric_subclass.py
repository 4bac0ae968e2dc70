from typing import TypeVar

from witcert_calculus import AtConsume, Contract, KeyResidualAbs, Metric, Proof, Site, register_metric

S = TypeVar("S", bound=Site)


@register_metric(unit="absolute l2", meaning="a user's residual")
class Residual(Metric[S]):
    pass


@register_metric(unit="absolute l2", meaning="a refinement of the user's residual")
class FineResidual(Residual[S]):
    pass


proof = Proof("WitCert.Contract.id_sound")
fine = Contract(FineResidual[AtConsume], FineResidual[AtConsume], a=1, b=0, evidence=proof, name="fine")
coarse = Contract(Residual[AtConsume], Residual[AtConsume], a=1, b=0, evidence=proof, name="coarse")
bad = fine >> coarse  # expect-mypy: Unsupported operand types for >> ("Contract[FineResidual[AtConsume], FineResidual[AtConsume]]" and "Contract[Residual[AtConsume], Residual[AtConsume]]")  # expect-pyright: Operator ">>" not supported for types "Contract[FineResidual[AtConsume], FineResidual[AtConsume]]"


class MyKey(KeyResidualAbs[S]):  # expect-mypy: Cannot inherit from final class "KeyResidualAbs"  # expect-pyright: is marked final and cannot be subclassed
    pass
