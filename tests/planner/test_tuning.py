"""Cluster tuning: the chosen settings are the cheapest of those tried, decided flags are
kept, and a merge is taken only when it lowers the estimated step within memory."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from lightning_embark.plan import ClusterPlan, Plan, layouts
from lightning_embark.planner import CostModel, load_calibration
from lightning_embark.planner._tuning import (
    cluster_terms,
    hierarchical_flags,
    merge_clusters,
    tune_clusters,
)
from lightning_embark.spec import load_spec

W, LOCAL = 4, 2


def _model(num_hosts: int = 2) -> CostModel:
    spec = load_spec("demo-small")
    calib = load_calibration("emulated")
    return CostModel(
        spec, calib, num_hosts=num_hosts, ranks_per_host=W // num_hosts, batch_size=512
    )


def _plan(ranks_per_host: int = LOCAL) -> Plan:
    return Plan(
        world_size=W,
        ranks_per_host=ranks_per_host,
        clusters=(
            ClusterPlan(name="dp", type="dp"),
            ClusterPlan(name="rb", type="rb"),
            ClusterPlan(name="ub", type="ub"),
        ),
        tables=(
            layouts.data_parallel("f4", "dp", world_size=W),
            layouts.table_wise("f0", "rb", rank=0),
            layouts.table_wise("f2", "rb", rank=1),
            layouts.table_row_wise("f3", "rb", host=1, ranks_per_host=2),
            layouts.column_wise("f5", "rb", ranks=[0, 2]),
            layouts.table_wise("f6", "rb", rank=2),
            layouts.table_wise("f7", "rb", rank=3),
            layouts.row_wise("f1", "ub", ranks=range(W)),
        ),
    )


def _step(model: CostModel, plan: Plan) -> float:
    """The estimated step of ``plan`` as tuning scores it: summed terms and overheads."""
    total, overhead = 0.0, 0.0
    for cluster in plan.clusters:
        members = [i for i, t in enumerate(plan.tables) if t.cluster == cluster.name]
        terms, fixed = cluster_terms(model, plan, cluster, members)
        total, overhead = total + terms, overhead + fixed
    return float(model.step_seconds(total, overhead).max())


def test_the_chosen_settings_are_the_cheapest_single_setting() -> None:
    """Each cluster is tuned with the others held, so the result is at most the step of
    every uniform setting (one flag, one compression for all exchanged clusters)."""
    model, plan = _model(), _plan()
    allow = ("fp32", "fp16", "fp8")
    tuned = tune_clusters(model, plan, allow, {}, hierarchical=None)
    assert tuned.plan.tables == plan.tables
    assert tuned.step == _step(model, tuned.plan)
    for flag in (False, True):
        for comp in allow:
            uniform = replace(
                plan,
                clusters=tuple(
                    c
                    if c.type.value == "dp"
                    else replace(
                        c, forward_compression=comp, backward_compression=comp, hierarchical=flag
                    )
                    for c in plan.clusters
                ),
            )
            assert tuned.step <= _step(model, uniform) * (1 + 1e-12)
    assert tuned.plan.clusters[0] == plan.clusters[0]  # the DP cluster has nothing to tune


def test_decided_flags_are_kept_and_one_host_is_never_hierarchical() -> None:
    model, plan = _model(), _plan()
    for flag in (False, True):
        tuned = tune_clusters(model, plan, ("fp32",), {"rb": flag, "ub": flag}, hierarchical=None)
        assert hierarchical_flags(tuned.plan) == {"dp": False, "rb": flag, "ub": flag}
    one_host = tune_clusters(_model(num_hosts=1), _plan(W), ("fp32",), {}, hierarchical=True)
    assert not any(hierarchical_flags(one_host.plan).values())


def test_merges_only_when_cheaper_and_within_memory() -> None:
    model, plan = _model(), _plan()
    tuned = tune_clusters(model, plan, ("fp32",), {}, hierarchical=None)
    merged = merge_clusters(
        model, plan, ("fp32",), limit=float(np.inf), fixed={}, hierarchical=None
    )
    assert [t.ranks for t in merged.tables] == [t.ranks for t in plan.tables]
    # With the emulated preset's per-call latencies, the UB cluster's own collectives
    # cost more than row-wise unique exchange saves on its one small table.
    assert {c.name for c in merged.clusters} == {"dp", "rb"}
    assert _step(model, merged) < tuned.step
    refused = merge_clusters(model, plan, ("fp32",), limit=0.0, fixed={}, hierarchical=None)
    assert {c.name for c in refused.clusters} == {"dp", "rb", "ub"}  # no merge fits in 0 bytes
