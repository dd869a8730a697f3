"""The feature-affinity matrix ordered by tower, as a PNG.

A good partition shows as bright blocks on the diagonal (pairs kept inside a tower)
and a dark rest (pairs that meet only after compression).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from lightning_embark.plan import TowerRequest
from lightning_embark.planner._partition import FeatureAffinity, kept_affinity


def plot_affinity(
    affinity: FeatureAffinity, towers: Sequence[TowerRequest], path: str, *, title: str = ""
) -> None:
    """Heat map of ``affinity`` with rows and columns grouped by ``towers`` (flat
    features last), tower boundaries drawn, written to ``path`` (Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    in_towers = [t for tower in towers for t in tower.tables]
    flat = [f for f in affinity.features if f not in set(in_towers)]
    order = in_towers + flat
    matrix = affinity.over(order)
    index = {n: i for i, n in enumerate(order)}
    groups = [[index[t] for t in tower.tables] for tower in towers]
    kept = kept_affinity(matrix, groups)
    size = max(6.0, min(16.0, 0.28 * len(order) + 2))
    fig, ax = plt.subplots(figsize=(size + 1.5, size))
    shown = ax.imshow(matrix, cmap="magma", interpolation="nearest")
    fig.colorbar(shown, ax=ax, fraction=0.04, label="affinity (RMS of the pair's term)")
    edges = np.cumsum([len(g) for g in groups])
    for edge in edges[: len(edges) - (0 if flat else 1)]:
        ax.axhline(edge - 0.5, color="cyan", linewidth=1.2)
        ax.axvline(edge - 0.5, color="cyan", linewidth=1.2)
    starts = np.concatenate([[0], edges[:-1]])
    for tower, start, stop in zip(towers, starts, edges, strict=True):
        ax.text(
            (start + stop - 1) / 2,
            1.01,
            tower.name,
            transform=ax.get_xaxis_transform(),
            ha="center",
            va="bottom",
            fontsize=9,
        )
    step = max(1, len(order) // 60)
    ticks = list(range(0, len(order), step))
    ax.set_xticks(ticks, [order[i] for i in ticks], rotation=90, fontsize=7)
    ax.set_yticks(ticks, [order[i] for i in ticks], fontsize=7)
    ax.set_title(
        (title + "\n" if title else "")
        + f"{len(towers)} towers, {len(flat)} flat features; {kept:.0%} of the affinity "
        "kept inside towers",
        fontsize=10,
        pad=22,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
