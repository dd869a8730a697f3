"""CostModel.estimate by hand: shape checks, the slowest rank's step, memory with exchange
buffers, per-cluster latency and all-reduce, and estimate_plan as a shortcut.

Round constants (1 GB/s links and lookups inside a host, no latencies unless set) make
the byte figures exact integers (compared with ``==``); times are a few products and
quotients of exact numbers (float64 rounding ~1e-16 per step), compared with
``rel=1e-12``.
"""

from __future__ import annotations

import dataclasses

import pytest

from lightning_embark.errors import ConfigError
from lightning_embark.plan import layouts
from lightning_embark.plan._types import ClusterPlan, Plan, TableLayout
from lightning_embark.planner._cost import CostModel, Estimate, estimate_plan
from lightning_embark.planner._hardware import Calibration
from lightning_embark.planner._stats import DataStats, FeatureStats, from_spec
from lightning_embark.spec import ModelSpec, TableSpec

REL = 1e-12
CALIB = Calibration(intra_bandwidth=1e9, inter_bandwidth=1e8, lookup_bandwidth=1e9)
B, H, D, ROWS = 8, 3, 16, 100
SPEC = ModelSpec(
    name="one",
    tables=(TableSpec(name="t", num_embeddings=ROWS, embedding_dim=D, pooling_factor=H),),
)
STATS = DataStats(batch_size=B, features={"t": FeatureStats(hotness=H, unique_ratio=0.5)})


def _model(calib: Calibration = CALIB, hosts: int = 1, local: int = 2) -> CostModel:
    return CostModel(SPEC, calib, num_hosts=hosts, ranks_per_host=local, batch_size=B, stats=STATS)


def _plan(layout: TableLayout, cluster: str = "rb", world: int = 2, local: int = 2) -> Plan:
    return Plan(
        world_size=world,
        ranks_per_host=local,
        clusters=(ClusterPlan(name=cluster, type=cluster),),
        tables=(layout,),
    )


def test_a_plan_of_another_shape_is_refused() -> None:
    model = _model()
    with pytest.raises(
        ConfigError,
        match=r"plan is for 4 ranks \(2 per host\) but the cost model is for 2 \(2 per host\); "
        "build the CostModel for the plan's cluster",
    ):
        model.estimate(_plan(layouts.table_wise("t", "rb", 0), world=4))
    with pytest.raises(ConfigError, match=r"plan is for 2 ranks \(1 per host\)"):
        model.estimate(_plan(layouts.table_wise("t", "rb", 0), local=1))


def test_a_plan_missing_a_table_is_refused() -> None:
    plan = _plan(layouts.table_wise("other", "rb", 0))
    with pytest.raises(ConfigError, match="table 't' is missing from the plan"):
        _model().estimate(plan)


def test_bad_shapes_and_batch_sizes_are_refused() -> None:
    with pytest.raises(ConfigError, match="batch_size must be a positive integer"):
        CostModel(SPEC, CALIB, num_hosts=1, ranks_per_host=2, batch_size=0)
    with pytest.raises(ConfigError, match=r"hosts \(0\) and ranks per host \(2\)"):
        CostModel(SPEC, CALIB, num_hosts=0, ranks_per_host=2, batch_size=8)


def test_the_step_is_the_slowest_ranks_and_memory_holds_the_buffers() -> None:
    """Table-wise RB table on rank 1 of 1 host x 2 ranks.

    Rank 0 only requests: it sends 4 (B + B h) = 128 ID bytes plus B = 8 gradient rows
    of 64 bytes (640) and receives 8 answer rows (512). Rank 1 answers: it reads B h = 24
    rows of 64 bytes for each of the 2 requesters, forward plus twice that backward.
    """
    calib = dataclasses.replace(CALIB, buffer_factor=2.0)
    estimate = _model(calib).estimate(_plan(layouts.table_wise("t", "rb", 1)))
    r0, r1 = estimate.per_rank
    assert (r0.rank, r0.host, r1.rank, r1.host) == (0, 0, 1, 0)
    assert (r0.intra_bytes, r1.intra_bytes, r0.inter_bytes, r1.inter_bytes) == (640, 512, 0, 0)
    lookup = 2 * B * H * D * 4 * 3 / 1e9
    assert (r0.compute_ms, r1.compute_ms) == (0, pytest.approx(1e3 * lookup, rel=REL))
    # each rank's link time is the larger of what it sends and receives: 640 bytes
    assert r0.intra_ms == r1.intra_ms == pytest.approx(1e3 * 640 / 1e9, rel=REL)
    assert r0.total_ms == pytest.approx(1e3 * 640 / 1e9, rel=REL)
    assert r1.total_ms == pytest.approx(1e3 * (lookup + 640 / 1e9), rel=REL)
    assert estimate.step_time_ms == max(r0.total_ms, r1.total_ms) == r1.total_ms
    # memory: stored rows (4-byte weights + a 4-byte row state) + 2 x bytes received
    assert r0.memory_bytes == 2 * 512
    assert r1.memory_bytes == ROWS * (D * 4 + 4) + 2 * 640 == 8080
    assert estimate.max_memory_bytes == 8080
    assert estimate.stats_source == STATS.source


def test_latency_is_per_exchanged_cluster_and_grows_with_replicas() -> None:
    calib = dataclasses.replace(CALIB, intra_latency=1e-3)
    model = _model(calib)
    plain = model.estimate(_plan(layouts.table_wise("t", "rb", 1)))
    # 4 flat calls, each waiting for 1 peer
    assert [r.latency_ms for r in plain.per_rank] == pytest.approx([4.0, 4.0], rel=REL)
    replicated = model.estimate(_plan(layouts.replicated("t", "rb", [[0], [1]])))
    assert [r.latency_ms for r in replicated.per_rank] == pytest.approx([5.0, 5.0], rel=REL)
    assert all(r.allreduce_ms == 0 for r in replicated.per_rank)
    # latency adds into the step
    assert plain.per_rank[1].total_ms == pytest.approx(
        _model().estimate(_plan(layouts.table_wise("t", "rb", 1))).per_rank[1].total_ms + 4.0,
        rel=REL,
    )


def test_dp_clusters_pay_one_all_reduce_and_their_dense_passes() -> None:
    """The 100 x 16 fp32 replica is 6400 bytes: a 2-rank ring sends half of it twice."""
    calib = dataclasses.replace(CALIB, dp_dense_bandwidth=1e9)
    estimate = _model(calib).estimate(_plan(layouts.data_parallel("t", "dp", 2), "dp"))
    ring = 2 * 1 / 2 * 6400 / 1e9
    dense = 6400 / 1e9
    for r in estimate.per_rank:
        assert r.allreduce_ms == pytest.approx(1e3 * (ring + dense), rel=REL)
        assert r.latency_ms == 0
        assert r.compute_ms == pytest.approx(1e3 * B * H * D * 4 * 3 / 1e9, rel=REL)
        assert (r.intra_bytes, r.inter_bytes) == (0, 0)
        assert r.memory_bytes == ROWS * (D * 4 + 4)
        assert r.total_ms == pytest.approx(r.compute_ms + r.allreduce_ms, rel=REL)


def test_without_stats_the_spec_gives_the_analytic_estimate() -> None:
    model = CostModel(SPEC, CALIB, num_hosts=1, ranks_per_host=2, batch_size=B)
    estimate = model.estimate(_plan(layouts.table_wise("t", "rb", 1)))
    assert estimate.stats_source == from_spec(SPEC, batch_size=B).source
    assert "not measured" in estimate.stats_source


def _two_cluster_plan() -> tuple[ModelSpec, Plan]:
    spec = ModelSpec(
        name="two",
        tables=(
            TableSpec(name="a", num_embeddings=50, embedding_dim=8, pooling_factor=2.0),
            TableSpec(name="b", num_embeddings=40, embedding_dim=16, pooling_factor=1.0),
        ),
    )
    plan = Plan(
        world_size=4,
        ranks_per_host=2,
        clusters=(
            ClusterPlan(name="ub", type="ub", forward_compression="fp16", hierarchical=True),
            ClusterPlan(name="dp", type="dp"),
        ),
        tables=(layouts.row_wise("a", "ub", range(4)), layouts.data_parallel("b", "dp", 4)),
    )
    return spec, plan


def test_estimate_plan_equals_the_cost_models_estimate() -> None:
    spec, plan = _two_cluster_plan()
    calib = dataclasses.replace(CALIB, intra_latency=1e-5, inter_latency=1e-4)
    direct = CostModel(spec, calib, num_hosts=2, ranks_per_host=2, batch_size=16).estimate(plan)
    shortcut = estimate_plan(plan, spec, calib, batch_size=16)
    assert isinstance(shortcut, Estimate)
    assert shortcut.to_dict() == direct.to_dict()
    assert shortcut.step_time_ms == max(r.total_ms for r in shortcut.per_rank) > 0


def test_estimate_to_dict() -> None:
    estimate = _model().estimate(_plan(layouts.table_wise("t", "rb", 1)))
    data = estimate.to_dict()
    assert set(data) == {"step_time_ms", "max_memory_bytes", "stats_source", "per_rank"}
    assert data["per_rank"][1]["rank"] == 1 and isinstance(data["per_rank"][1]["rank"], int)
    assert data["per_rank"][1]["memory_bytes"] == ROWS * (D * 4 + 4) + 640
    assert data["max_memory_bytes"] == estimate.max_memory_bytes
