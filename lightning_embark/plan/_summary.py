"""A plan as text: one line per cluster and per table (logs, ``embark-plan``, strategies)."""

from __future__ import annotations

from lightning_embark.plan._cache import is_cached
from lightning_embark.plan._towers import TowerPlan
from lightning_embark.plan._types import ClusterType, Plan
from lightning_embark.topology import Topology


def plan_summary(plan: Plan, topology: Topology | None = None) -> str:
    """One line per cluster and per table (type, (r, k, c), compression, ranks, and the
    HBM cache share of a table cached in UVM), then one per tower (host, module, output
    wire format, tables) and, when the planner chose them, why."""
    lines = []
    if topology is not None:
        lines.append(
            f"topology {topology.name}: {topology.num_hosts} host(s) x {topology.ranks_per_host} "
            "rank(s)"
        )
    lines.append(
        f"plan: {plan.world_size} ranks, {plan.ranks_per_host} per host, {len(plan.tables)} tables"
    )
    for cluster in plan.clusters:
        tables = [t for t in plan.tables if t.cluster == cluster.name]
        compression = (
            "-"
            if cluster.type is ClusterType.DP
            else f"{cluster.forward_compression.value}/{cluster.backward_compression.value}"
        )
        exchange = "hierarchical" if cluster.hierarchical else "flat"
        lines.append(
            f"cluster {cluster.name} ({cluster.type.value.upper()}, compression fwd/bwd "
            f"{compression}, {exchange}): {len(tables)} table(s)"
        )
        for t in tables:
            ranks = (
                "all"
                if cluster.type is ClusterType.DP
                else "; ".join(",".join(str(r) for r in group) for group in t.ranks)
            )
            split = f" {t.row_split.value}" if t.num_row_shards > 1 else ""
            cache = f" uvm_cache={t.cache_load_factor:g}" if is_cached(t.cache_load_factor) else ""
            lines.append(
                f"  {t.table}: {cluster.type.value.upper()} r={t.num_replicas} "
                f"k={t.num_row_shards}{split} "
                f"c={t.num_col_shards} compression={compression} ranks={ranks}{cache}"
            )
    lines += [tower_line(tower) for tower in plan.towers]
    if plan.tower_choice is not None:
        lines.append(f"towers: {plan.tower_choice.chosen} ({plan.tower_choice.reason})")
    return "\n".join(lines)


def tower_line(tower: TowerPlan) -> str:
    """One tower as the summaries print it: host, module and width, wire formats, tables."""
    width = "" if tower.output_dim is None else f" -> {tower.output_dim} wide"
    return (
        f"tower {tower.name} on host {tower.host} ({tower.module.value}{width}, output "
        f"{tower.forward_compression}/{tower.backward_compression}): tables "
        f"{', '.join(tower.tables)}"
    )
