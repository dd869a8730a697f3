"""Plot plans side by side: per-rank stacked cost, memory, and table-to-rank placement."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from lightning_embark.plan import Plan
from lightning_embark.planner._cost import Estimate


def plot_plans(plans: Sequence[tuple[str, Plan, Estimate]], path: str) -> None:
    """One row of three panels per plan, written as a PNG (Agg backend, no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(plans), 3, figsize=(18, 4.5 * len(plans)), squeeze=False)
    for row, (label, plan, estimate) in enumerate(plans):
        ranks = np.arange(plan.world_size)
        parts = {
            "compute": [r.compute_ms for r in estimate.per_rank],
            "intra-host": [r.intra_ms for r in estimate.per_rank],
            "inter-host": [r.inter_ms for r in estimate.per_rank],
            "latency": [r.latency_ms for r in estimate.per_rank],
            "all-reduce": [r.allreduce_ms for r in estimate.per_rank],
        }
        bottom = np.zeros(plan.world_size)
        ax = axes[row][0]
        for name, values in parts.items():
            ax.bar(ranks, values, bottom=bottom, label=name)
            bottom += np.asarray(values)
        ax.set_title(f"{label}: per-rank cost (step {estimate.step_time_ms:.2f} ms)")
        ax.set_xlabel("rank")
        ax.set_ylabel("ms")
        ax.legend(fontsize=7)
        ax = axes[row][1]
        ax.bar(ranks, [r.memory_bytes / 2**30 for r in estimate.per_rank])
        ax.set_title(f"{label}: memory per rank")
        ax.set_xlabel("rank")
        ax.set_ylabel("GiB")
        grid = np.zeros((len(plan.tables), plan.world_size))
        for t, layout in enumerate(plan.tables):
            for group in layout.ranks:
                for rank in group:
                    grid[t, rank] += 1
        ax = axes[row][2]
        ax.imshow(grid > 0, aspect="auto", interpolation="nearest", cmap="Greys")
        ax.set_title(f"{label}: table placement")
        ax.set_xlabel("rank")
        ax.set_ylabel("table")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
