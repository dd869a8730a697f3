"""Greedy planner: valid, memory-feasible and deterministic plans; one clear error."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lightning_embark.errors import ConfigError, PlanInfeasibleError
from lightning_embark.plan._types import ClusterType
from lightning_embark.planner._cost import CostModel
from lightning_embark.planner._greedy import GreedyPlanner
from lightning_embark.planner._greedy_config import GreedyConfig
from lightning_embark.planner._hardware import Calibration, load_calibration
from lightning_embark.spec import IdDistribution, ModelSpec, TableSpec, load_spec

tables = st.lists(
    st.tuples(
        st.integers(1, 200_000),  # rows
        st.sampled_from([4, 8, 16, 32, 64, 128]),  # width
        st.floats(0.5, 60.0),  # hotness
    ),
    min_size=1,
    max_size=25,
)


@st.composite
def problems(draw):
    rows = draw(tables)
    spec = ModelSpec(
        name="random",
        tables=tuple(
            TableSpec(name=f"t{i}", num_embeddings=n, embedding_dim=d, pooling_factor=h)
            for i, (n, d, h) in enumerate(rows)
        ),
        id_distribution=IdDistribution(kind=draw(st.sampled_from(["uniform", "zipf"])), alpha=1.1),
    )
    calib = load_calibration(draw(st.sampled_from(["dgx-h100", "emulated"])))
    needed = sum(n * (d * 4 + 4) for n, d, _ in rows)
    hosts, local = draw(st.integers(1, 4)), draw(st.sampled_from([1, 2, 4, 8]))
    slack = draw(st.floats(2.0, 50.0))
    calib = Calibration.from_dict(
        calib.to_dict() | {"memory_per_rank": max(needed * slack / (hosts * local), 4096)}
    )
    batch = draw(st.sampled_from([16, 128, 1024]))
    allow = draw(st.sampled_from([("fp32",), ("fp32", "fp16", "int8"), ("fp32", "bf16", "fp8")]))
    return spec, calib, hosts, local, batch, allow


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems())
def test_every_plan_validates_fits_and_is_deterministic(problem) -> None:
    spec, calib, hosts, local, batch, allow = problem
    model = CostModel(spec, calib, num_hosts=hosts, ranks_per_host=local, batch_size=batch)
    planner = GreedyPlanner(GreedyConfig(allow=allow))
    try:
        result = planner.plan(model)
    except PlanInfeasibleError as error:  # tight memory: the one infeasibility error
        infeasible: PlanInfeasibleError | None = error
    else:
        infeasible = None
    if infeasible is not None:  # it names a table and the shortfall
        assert "does not fit" in str(infeasible) and "short by" in str(infeasible)
        assert infeasible.table in {t.name for t in spec.tables} and infeasible.shortfall_bytes > 0
        return
    plan = result.plan
    plan.validate(
        spec,
        calib.topology(num_hosts=hosts, ranks_per_host=local),
        bytes_per_row_element=calib.bytes_per_element,
    )
    assert result.estimate.max_memory_bytes <= calib.memory_per_rank
    assert result.estimate.step_time_ms > 0
    assert {c.forward_compression.value for c in plan.clusters} <= set(allow)
    again = GreedyPlanner(GreedyConfig(allow=allow)).plan(
        CostModel(spec, calib, num_hosts=hosts, ranks_per_host=local, batch_size=batch)
    )
    assert again.plan == plan


def test_infeasible_spec_names_table_and_shortfall() -> None:
    spec = ModelSpec(
        name="big",
        tables=(
            TableSpec(name="small", num_embeddings=100, embedding_dim=16, pooling_factor=1.0),
            TableSpec(name="huge", num_embeddings=10**9, embedding_dim=128, pooling_factor=1.0),
        ),
    )
    model = CostModel(
        spec, load_calibration("emulated"), num_hosts=2, ranks_per_host=2, batch_size=64
    )
    with pytest.raises(
        ConfigError, match=r"table 'huge' does not fit.*short by [0-9.]+ [KMG]?i?B"
    ):
        GreedyPlanner().plan(model)


def test_ub_for_repetitive_features_rb_for_hot_unique_ones() -> None:
    spec = ModelSpec(
        name="mix",
        tables=(
            TableSpec(
                name="tiny_vocab", num_embeddings=500, embedding_dim=64, pooling_factor=20.0
            ),
            TableSpec(
                name="huge_vocab", num_embeddings=10**8, embedding_dim=64, pooling_factor=20.0
            ),
        ),
    )
    calib = load_calibration("dgx-h100")
    plan = (
        GreedyPlanner(GreedyConfig(dp=False))
        .plan(CostModel(spec, calib, num_hosts=2, ranks_per_host=8, batch_size=4096))
        .plan
    )
    assert plan.cluster(plan.layout("tiny_vocab").cluster).type is ClusterType.UB
    assert plan.cluster(plan.layout("huge_vocab").cluster).type is ClusterType.RB


def test_lossy_compression_only_when_allowed_and_helpful() -> None:
    spec = load_spec("mlperf-dlrm-dcnv2")
    calib = load_calibration("dgx-h100")
    model = CostModel(spec, calib, num_hosts=4, ranks_per_host=8, batch_size=4096)
    lossless = GreedyPlanner().plan(model)
    assert all(c.forward_compression.value == "fp32" for c in lossless.plan.clusters)
    lossy = GreedyPlanner(GreedyConfig(allow=("fp32", "fp8"))).plan(model)
    assert lossy.estimate.step_time_ms < lossless.estimate.step_time_ms


def test_a_cluster_that_does_not_repay_its_collectives_is_folded() -> None:
    spec = ModelSpec(
        name="mix",
        tables=(
            TableSpec(
                name="tiny_vocab", num_embeddings=500, embedding_dim=64, pooling_factor=20.0
            ),
            TableSpec(
                name="huge_vocab", num_embeddings=10**8, embedding_dim=64, pooling_factor=20.0
            ),
        ),
    )
    cheap = load_calibration("dgx-h100")
    model = CostModel(spec, cheap, num_hosts=2, ranks_per_host=8, batch_size=4096)
    both = GreedyPlanner(GreedyConfig(dp=False)).plan(model).plan
    assert {c.type for c in both.clusters} == {ClusterType.UB, ClusterType.RB}
    # 50 ms per exchanged cluster and step: a second cluster costs more than UB saves.
    costly = Calibration.from_dict(cheap.to_dict() | {"kernel_overhead": 0.05})
    model = CostModel(spec, costly, num_hosts=2, ranks_per_host=8, batch_size=4096)
    one = GreedyPlanner(GreedyConfig(dp=False)).plan(model)
    assert [c.type for c in one.plan.clusters] == [ClusterType.RB]
    assert {t.table: t.ranks for t in one.plan.tables} == {t.table: t.ranks for t in both.tables}
    assert one.estimate.step_time_ms < model.estimate(both).step_time_ms
