"""The greedy planner's scalar split costs carry the calibrated fixed terms of the full model."""

from __future__ import annotations

import dataclasses

import pytest

from lightning_embark.plan._types import ClusterType, Compression
from lightning_embark.planner._cost import CostModel
from lightning_embark.planner._greedy import GreedyPlanner
from lightning_embark.planner._hardware import load_calibration
from lightning_embark.planner._split import Candidates, Shape, dp_seconds, split_cost
from lightning_embark.planner._terms import TableLoad
from lightning_embark.spec import ModelSpec, TableSpec

LOAD = TableLoad(batch=512, hotness=8.0, unique=900.0, dim=64, rows=100_000)


def _shape(**overrides: float) -> Shape:
    calib = dataclasses.replace(load_calibration("dgx-h100"), **overrides)
    return Shape(calib, num_hosts=2, ranks_per_host=4, compression=Compression.FP32)


@pytest.mark.parametrize(
    ("kind", "k", "c"), [(ClusterType.RB, 1, 1), (ClusterType.RB, 4, 2), (ClusterType.UB, 2, 1)]
)
def test_piece_and_id_terms_scale_with_blocks_and_ids(kind: ClusterType, k: int, c: int) -> None:
    world = 8
    plain = split_cost(LOAD, kind, k, c, _shape(), True)
    pieces = split_cost(LOAD, kind, k, c, _shape(piece_seconds=1e-3), True)
    # each block serves every rank (a piece each); every rank receives one piece per block
    assert pieces.block - plain.block == pytest.approx(world * 1e-3)
    assert pieces.total - plain.total == pytest.approx(2 * k * c * world * 1e-3)
    ids = split_cost(LOAD, kind, k, c, _shape(lookup_id_seconds=1e-6), True)
    read = LOAD.unique / k if kind is ClusterType.UB else LOAD.batch * LOAD.hotness / k
    assert ids.block - plain.block == pytest.approx(world * read * 1e-6)
    updates = split_cost(LOAD, kind, k, c, _shape(update_row_seconds=1e-6), True)
    # every rank's distinct IDs in the block, at most the block's rows
    assert updates.block - plain.block == pytest.approx(
        min(-(-LOAD.rows // k), world * LOAD.unique / k) * 1e-6
    )
    dense = dp_seconds(LOAD, _shape(dp_dense_bandwidth=1e9)) - dp_seconds(LOAD, _shape())
    assert dense == pytest.approx(4 * LOAD.rows * LOAD.dim / 1e9)


def test_vectorised_candidates_equal_scalar_costs() -> None:
    shape = _shape(
        piece_seconds=2e-4,
        lookup_bag_seconds=1e-7,
        lookup_id_seconds=3e-8,
        update_row_seconds=4e-7,
    )
    candidates = Candidates(LOAD, ClusterType.RB, shape, min_col_width=8, hierarchical=True)
    assert len(candidates.k) > 4
    for k, c, block, total in zip(
        candidates.k, candidates.c, candidates.block, candidates.total, strict=False
    ):
        scalar = split_cost(LOAD, ClusterType.RB, int(k), int(c), shape, True)
        assert (scalar.block, scalar.total) == pytest.approx((block, total))


def test_costly_pieces_keep_tables_whole() -> None:
    spec = ModelSpec(
        name="hot",
        tables=tuple(
            TableSpec(name=f"t{i}", num_embeddings=50_000, embedding_dim=128, pooling_factor=40.0)
            for i in range(3)
        ),
    )
    base = load_calibration("dgx-h100")
    split = (
        GreedyPlanner()
        .plan(CostModel(spec, base, num_hosts=2, ranks_per_host=4, batch_size=4096))
        .plan
    )
    assert any(t.num_row_shards * t.num_col_shards > 1 for t in split.tables), (
        "three hot tables on 8 ranks split"
    )
    costly = dataclasses.replace(base, piece_seconds=0.05)
    whole = (
        GreedyPlanner()
        .plan(CostModel(spec, costly, num_hosts=2, ranks_per_host=4, batch_size=4096))
        .plan
    )
    assert all(t.num_row_shards * t.num_col_shards == 1 for t in whole.tables)


@pytest.mark.parametrize(
    ("kind", "k", "c"), [(ClusterType.RB, 1, 4), (ClusterType.RB, 4, 1), (ClusterType.UB, 2, 2)]
)
def test_row_splits_charge_every_requester_for_routing_its_ids(
    kind: ClusterType, k: int, c: int
) -> None:
    world, per_id = 8, 1e-6
    plain = split_cost(LOAD, kind, k, c, _shape(), True)
    routed = split_cost(LOAD, kind, k, c, _shape(route_id_seconds=per_id), True)
    ids = LOAD.unique if kind is ClusterType.UB else LOAD.batch * LOAD.hotness
    assert routed.block == pytest.approx(plain.block)  # the owners' side does not change
    assert routed.total - plain.total == pytest.approx(world * ids * per_id if k > 1 else 0.0)


def test_the_term_model_charges_routing_to_requesters_of_row_split_tables() -> None:
    from lightning_embark.plan import layouts
    from lightning_embark.plan._types import ClusterPlan, Plan

    spec = ModelSpec(
        name="one",
        tables=(TableSpec(name="t", num_embeddings=50_000, embedding_dim=64, pooling_factor=8.0),),
    )
    cluster = ClusterPlan(name="rb", type=ClusterType.RB)

    def compute_ms(layout, **calib) -> list[float]:
        plan = Plan(world_size=8, ranks_per_host=4, clusters=(cluster,), tables=(layout,))
        model = CostModel(
            spec,
            dataclasses.replace(load_calibration("dgx-h100"), **calib),
            num_hosts=2,
            ranks_per_host=4,
            batch_size=512,
        )
        return [r.compute_ms for r in model.estimate(plan).per_rank]

    row_wise = layouts.row_wise("t", "rb", range(8))
    extra = [
        b - a
        for a, b in zip(
            compute_ms(row_wise), compute_ms(row_wise, route_id_seconds=1e-6), strict=False
        )
    ]
    assert extra == pytest.approx([1e3 * 512 * 8.0 * 1e-6] * 8)
    table_wise = layouts.table_wise("t", "rb", 3)
    assert compute_ms(table_wise) == pytest.approx(compute_ms(table_wise, route_id_seconds=1e-6))


def test_costly_routing_keeps_hot_tables_whole() -> None:
    spec = ModelSpec(
        name="hot",
        tables=tuple(
            TableSpec(name=f"t{i}", num_embeddings=50_000, embedding_dim=128, pooling_factor=40.0)
            for i in range(3)
        ),
    )
    costly = dataclasses.replace(load_calibration("dgx-h100"), route_id_seconds=1e-6)
    plan = (
        GreedyPlanner()
        .plan(CostModel(spec, costly, num_hosts=2, ranks_per_host=4, batch_size=4096))
        .plan
    )
    assert all(t.num_row_shards == 1 for t in plan.tables)


def test_int8_uses_its_own_codec_bandwidth_when_calibrated() -> None:
    from lightning_embark.planner._terms import piece_and_codec

    calib = dataclasses.replace(
        load_calibration("emulated"), codec_bandwidth=2e9, int8_codec_bandwidth=5e8
    )
    assert piece_and_codec(calib, Compression.FP8)[1] == pytest.approx(1 / 2e9)
    assert piece_and_codec(calib, Compression.INT8)[1] == pytest.approx(1 / 5e8)
    unset = dataclasses.replace(calib, int8_codec_bandwidth=None)
    assert piece_and_codec(unset, Compression.INT8)[1] == pytest.approx(1 / 2e9)
    with pytest.raises(ValueError, match="int8_codec_bandwidth"):
        dataclasses.replace(calib, int8_codec_bandwidth=0.0)


def test_hierarchical_steps_pay_more_calls_to_fewer_peers() -> None:
    from lightning_embark.plan._types import ClusterPlan
    from lightning_embark.planner._terms import TermModel

    calib = dataclasses.replace(
        load_calibration("dgx-h100"), intra_latency=1e-3, inter_latency=1e-2, kernel_overhead=0.0
    )
    terms = TermModel(calib, num_hosts=4, ranks_per_host=8)
    flat = ClusterPlan(name="f", type=ClusterType.RB)
    hier = ClusterPlan(name="h", type=ClusterType.RB, hierarchical=True)
    assert terms.latency(flat, False) == pytest.approx(4 * (7 * 1e-3 + 24 * 1e-2))
    assert terms.latency(hier, False) == pytest.approx(6 * 7 * 1e-3 + 4 * 3 * 1e-2)
    assert terms.latency(hier, True) - terms.latency(hier, False) == pytest.approx(
        7 * 1e-3 + 24 * 1e-2
    )
    ub_hier = ClusterPlan(
        name="u", type=ClusterType.UB, hierarchical=True
    )  # swaps counts in every intra stage
    assert terms.latency(ub_hier, False) == pytest.approx(8 * 7 * 1e-3 + 4 * 3 * 1e-2)


def test_dp_tables_must_repay_their_all_reduce() -> None:
    spec = ModelSpec(
        name="tiny",
        tables=(
            TableSpec(name="small", num_embeddings=100, embedding_dim=32, pooling_factor=1.0),
            TableSpec(name="big", num_embeddings=200_000, embedding_dim=32, pooling_factor=1.0),
        ),
    )
    base = dataclasses.replace(load_calibration("emulated"), allreduce_latency=0.0)

    def dp_tables(calib) -> list[str]:
        plan = (
            GreedyPlanner()
            .plan(CostModel(spec, calib, num_hosts=2, ranks_per_host=2, batch_size=256))
            .plan
        )
        return [t.table for t in plan.tables if plan.cluster(t.cluster).type is ClusterType.DP]

    assert dp_tables(base) == ["small"]
    assert dp_tables(dataclasses.replace(base, allreduce_latency=1.0)) == []
