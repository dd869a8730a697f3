"""Per-cluster settings of a laid-out plan: each exchanged cluster's hierarchical flag and
compression, and folding clusters into one where that is cheaper.

The layouts stay as the greedy planner placed them; only the clusters change. A setting
is chosen by the estimated step of the whole plan (``CostModel.step_seconds`` of the
summed per-rank terms), one cluster at a time in plan order, so that the choice accounts
for the slowest rank rather than the cluster's own bytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import NamedTuple

import numpy as np

from lightning_embark.plan import ClusterPlan, ClusterType, Compression, Plan
from lightning_embark.planner._cost import CostModel


class Tuned(NamedTuple):
    """A plan with its clusters' settings chosen, its estimated step and memory per rank."""

    plan: Plan
    step: float
    memory: np.ndarray


def hierarchical_flags(plan: Plan) -> dict[str, bool]:
    """Each cluster's hierarchical flag, by name (what later load targets keep)."""
    return {c.name: c.hierarchical for c in plan.clusters}


def cluster_terms(
    model: CostModel, plan: Plan, cluster: ClusterPlan, indices: list[int]
) -> tuple[np.ndarray | float, float]:
    """The per-rank cost terms of the tables ``indices`` under ``cluster``'s settings,
    and the cluster's fixed per-step overhead."""
    total: np.ndarray | float = 0.0
    replicated = False
    for i in indices:
        layout = plan.tables[i]
        total = total + model.table_terms(
            i, cluster, layout.num_row_shards, layout.num_col_shards, layout.ranks
        )
        replicated |= cluster.type is not ClusterType.DP and layout.num_replicas > 1
    return total, model.cluster_overhead(cluster, indices, replicated)


def tune_clusters(
    model: CostModel,
    plan: Plan,
    allow: tuple[Compression, ...],
    fixed: Mapping[str, bool],
    *,
    hierarchical: bool | None,
) -> Tuned:
    """Per exchanged cluster, the hierarchical flag and compression with the lowest step.

    Args:
        model: The cost model the plan is estimated with.
        plan: The laid-out plan; its tables are kept.
        allow: Compressions a cluster may take (the same forward and backward).
        fixed: Hierarchical flags decided before, by cluster name; kept where a setting
            with that flag exists.
        hierarchical: The planner's setting: None tries both flags on several hosts,
            True or False forces one (False on one host either way).
    """
    members = {
        c.name: [i for i, t in enumerate(plan.tables) if t.cluster == c.name]
        for c in plan.clusters
    }
    several_hosts = model.num_hosts > 1
    flags = (
        [False, True]
        if hierarchical is None and several_hosts
        else [bool(hierarchical) and several_hosts]
    )
    options = {}
    for cluster in plan.clusters:
        settings = [cluster]
        if cluster.type is not ClusterType.DP:
            settings = [
                ClusterPlan(
                    name=cluster.name,
                    type=cluster.type,
                    forward_compression=comp,
                    backward_compression=comp,
                    hierarchical=flag,
                )
                for flag in flags
                for comp in allow
            ]
        if cluster.name in fixed:  # decided on the first layout; later targets reuse it
            settings = [s for s in settings if s.hierarchical == fixed[cluster.name]] or settings
        options[cluster.name] = [
            (s, cluster_terms(model, plan, s, members[cluster.name])) for s in settings
        ]
    chosen = {name: opts[0] for name, opts in options.items()}

    def step(pick: dict) -> float:
        total = sum(t for _, (t, _) in pick.values())
        overhead = sum(f for _, (_, f) in pick.values())
        return float(model.step_seconds(total, overhead).max())

    for name, opts in options.items():
        scores = [step({**chosen, name: opt}) for opt in opts]
        chosen[name] = opts[int(np.argmin(scores))]
    total = sum(t for _, (t, _) in chosen.values())
    assert isinstance(total, np.ndarray)  # every plan has a table, so terms were added
    tuned = Plan(
        world_size=plan.world_size,
        ranks_per_host=plan.ranks_per_host,
        clusters=tuple(chosen[c.name][0] for c in plan.clusters),
        tables=plan.tables,
    )
    return Tuned(tuned, step(chosen), model.memory(total))


def merge_clusters(
    model: CostModel,
    plan: Plan,
    allow: tuple[Compression, ...],
    *,
    limit: float,
    fixed: Mapping[str, bool],
    hierarchical: bool | None,
) -> Plan:
    """Fold the UB cluster, then the row-split one, into an RB cluster where that lowers
    the estimated step within the memory ``limit`` per rank.

    Every exchanged cluster costs its own collectives and per-call latency, which a few
    tables' savings may not repay. Layouts are kept; each candidate is tuned with
    :func:`tune_clusters`, the flags it settles carried to the next candidate.
    """
    fixed = dict(fixed)
    best_plan, best_step, _ = tune_clusters(model, plan, allow, fixed, hierarchical=hierarchical)
    fixed.update(hierarchical_flags(best_plan))
    for source, targets in (("ub", ("rb", "rb_rows")), ("rb_rows", ("rb",))):
        for target in targets:
            names = {c.name for c in best_plan.clusters}
            if source not in names or target not in names:
                continue
            tables = tuple(
                replace(t, cluster=target) if t.cluster == source else t for t in best_plan.tables
            )
            merged = Plan(
                world_size=plan.world_size,
                ranks_per_host=plan.ranks_per_host,
                clusters=tuple(c for c in best_plan.clusters if c.name != source),
                tables=tables,
            )
            merged, step, memory = tune_clusters(
                model, merged, allow, fixed, hierarchical=hierarchical
            )
            fixed.update(hierarchical_flags(merged))
            if step < best_step - 1e-12 and memory.max() <= limit:
                best_plan, best_step = merged, step
    return best_plan
