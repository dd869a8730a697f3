"""Plot plans side by side: per-rank stacked cost, memory, and table-to-rank placement.

One row per plan, one column per quantity, and each column shares its y-axis across the
rows, so plans (embark's and torchrec's, say) compare at a glance. Every panel marks the
host boundaries (ranks ``h * ranks_per_host - 0.5``), where traffic changes link; the
placement panel names the tables (every ``ceil(n / max_labels)``-th when there are many)
and colours each block by the type of its table's cluster.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from lightning_embark.plan import ClusterType, Plan
from lightning_embark.planner._cost import Estimate

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

#: Placement colours by cluster type (DP in the cost panel's all-reduce colour: its cost).
CLUSTER_COLORS: dict[ClusterType, str] = {
    ClusterType.DP: "tab:purple",
    ClusterType.RB: "tab:blue",
    ClusterType.UB: "tab:orange",
}
#: The gid of the dashed lines drawn between hosts (tests and callers look them up by it).
HOST_BOUNDARY_GID = "host-boundary"


def plan_figure(plans: Sequence[tuple[str, Plan, Estimate]], *, max_labels: int = 40) -> Figure:
    """One row of three panels (cost, memory, placement) per ``(label, plan, estimate)``.

    Args:
        plans: The plans to compare, each with a label and its estimate.
        max_labels: At most this many table names on a placement panel's y-axis.
    """
    from matplotlib.figure import Figure

    fig = Figure(figsize=(18, 4.5 * len(plans)))
    axes = fig.subplots(len(plans), 3, squeeze=False, sharey="col")
    tables = _table_order(plan for _, plan, _ in plans)
    for row, (label, plan, estimate) in enumerate(plans):
        cost, memory, placement = axes[row]
        _cost_panel(cost, label, plan, estimate)
        memory.bar(np.arange(plan.world_size), [r.memory_bytes / 2**30 for r in estimate.per_rank])
        memory.set_title(f"{label}: memory per rank")
        memory.set_xlabel("rank")
        memory.set_ylabel("GiB")
        _placement_panel(placement, label, plan, tables, max_labels)
        for ax in (cost, memory, placement):
            ax.set_xticks(np.arange(plan.world_size))
            _host_boundaries(ax, plan)
        cost.legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_plans(plans: Sequence[tuple[str, Plan, Estimate]], path: str) -> None:
    """:func:`plan_figure` written as a PNG (no display, no pyplot state)."""
    plan_figure(plans).savefig(path, dpi=80)


def _table_order(plans: Iterable[Plan]) -> list[str]:
    """Every plan's tables, in the first plan's order, then any the others add: one row per
    table in every placement panel, so the shared y-axis means the same table."""
    order: dict[str, None] = {}
    for plan in plans:
        order.update(dict.fromkeys(t.table for t in plan.tables))
    return list(order)


def _cost_panel(ax: Axes, label: str, plan: Plan, estimate: Estimate) -> None:
    ranks = np.arange(plan.world_size)
    parts = {
        "compute": [r.compute_ms for r in estimate.per_rank],
        "intra-host": [r.intra_ms for r in estimate.per_rank],
        "inter-host": [r.inter_ms for r in estimate.per_rank],
        "latency": [r.latency_ms for r in estimate.per_rank],
        "all-reduce": [r.allreduce_ms for r in estimate.per_rank],
    }
    bottom = np.zeros(plan.world_size)
    for name, values in parts.items():
        ax.bar(ranks, values, bottom=bottom, label=name)
        bottom += np.asarray(values)
    ax.set_title(f"{label}: per-rank cost (step {estimate.step_time_ms:.2f} ms)")
    ax.set_xlabel("rank")
    ax.set_ylabel("ms")


def _placement_panel(
    ax: Axes, label: str, plan: Plan, tables: Sequence[str], max_labels: int
) -> None:
    from matplotlib.colors import to_rgb
    from matplotlib.patches import Patch

    image = np.ones((len(tables), plan.world_size, 3))  # white: no block of the table there
    row_of = {name: i for i, name in enumerate(tables)}
    types: set[ClusterType] = set()
    for layout in plan.tables:
        kind = plan.cluster(layout.cluster).type
        types.add(kind)
        for group in layout.ranks:
            for rank in group:
                image[row_of[layout.table], rank] = to_rgb(CLUSTER_COLORS[kind])
    ax.imshow(image, aspect="auto", interpolation="nearest")
    stride = max(1, math.ceil(len(tables) / max_labels))
    ticks = list(range(0, len(tables), stride))
    ax.set_yticks(ticks, [tables[i] for i in ticks], fontsize=7 if len(ticks) > 20 else 9)
    ax.set_title(f"{label}: table placement")
    ax.set_xlabel("rank")
    ax.set_ylabel("table")
    ax.legend(
        handles=[
            Patch(color=CLUSTER_COLORS[kind], label=kind.value.upper())
            for kind in ClusterType
            if kind in types
        ],
        title="cluster type",
        fontsize=7,
        loc="upper left",
        bbox_to_anchor=(1.0, 1.0),
    )


def _host_boundaries(ax: Axes, plan: Plan) -> None:
    """Dashed lines between the last rank of one host and the first of the next."""
    for host in range(1, plan.num_hosts):
        ax.axvline(
            host * plan.ranks_per_host - 0.5,
            color="black",
            linestyle="--",
            linewidth=1,
            gid=HOST_BOUNDARY_GID,
            label="host boundary" if host == 1 else None,
        )
