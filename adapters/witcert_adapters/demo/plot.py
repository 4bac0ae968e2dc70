# pyright: reportUnknownMemberType=false
"""The demo's plot: meter coverage per layer, one line per scheme.

Main declarations
-----------------
- :func:`plot_coverage`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["plot_coverage"]


def plot_coverage(per_layer: Mapping[str, Sequence[float]], threshold: float, path: Path) -> None:
    """Write the per-layer coverage of every scheme as a PNG (matplotlib, Agg backend).

    Args:
        per_layer: per scheme, the covered fraction of each layer's decode-step cells.
        threshold: the coverage threshold (named on the y axis).
        path: the PNG to write.

    Example:
        >>> # plot_coverage({"int8_token": [1.0, 0.9]}, 0.1, Path("out/demo/coverage.png"))
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for scheme, cov in per_layer.items():
        ax.plot(range(len(cov)), cov, marker="o", ms=3,
                label=scheme)
    ax.set_xlabel("layer")
    ax.set_ylabel(f"fraction of (head, step) cells with meter <= {threshold}")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("WitCert meter coverage per layer, SmolLM2-135M")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
