"""Analytic bytes per step equal what the byte counter measures, exactly, per rank and link."""

from __future__ import annotations

import pytest

from lightning_embark.accounting import CommCounter, counting_collectives
from lightning_embark.engine._analytic_bytes import LinkBytes, analytic_bytes
from lightning_embark.engine._optimizer import OptimizerKind, SparseOptimizer
from lightning_embark.engine._sharded import ShardedEmbeddingBagCollection
from lightning_embark.plan._types import Compression
from lightning_embark.testing._ranks import run_gloo_ranks
from lightning_embark.testing._scenarios import all_layouts_plan, random_batches

RANKS_PER_HOST = 2

CASES = [
    # (cluster, forward, backward, hierarchical, optimizer, weighted)
    ("rb", Compression.FP32, Compression.FP32, False, OptimizerKind.SGD, False),
    ("rb", Compression.FP8, Compression.BF16, True, OptimizerKind.ROWWISE_ADAGRAD, True),
    ("ub", Compression.INT8, Compression.FP16, False, OptimizerKind.ROWWISE_ADAGRAD, False),
    ("ub", Compression.FP32, Compression.FP8, True, OptimizerKind.ADAGRAD, False),
]


def _measure(rank: int, world: int) -> None:
    for cluster, fwd, bwd, hierarchical, kind, weighted in CASES:
        scenario = all_layouts_plan(
            world,
            RANKS_PER_HOST,
            cluster,
            forward=fwd,
            backward=bwd,
            hierarchical=hierarchical,
            weighted=weighted,
        )
        sharded = ShardedEmbeddingBagCollection(
            scenario.tables,
            scenario.plan,
            sparse_optimizer=SparseOptimizer(kind=kind),
            is_weighted=weighted,
        )
        sizes = [5, 0, 7, 3][:world]
        batches = random_batches(scenario, sizes, seed=7, weighted=weighted)
        expected = analytic_bytes(
            scenario.plan, scenario.tables, batches, is_weighted=weighted, optimizer=kind
        )[rank]
        counter = CommCounter(rank=rank, ranks_per_host=RANKS_PER_HOST)
        with counting_collectives(counter):
            out = sharded(batches[rank])
            forward = counter.reset()
            out.values().sum().backward()
            backward = counter.reset()
        label = f"rank {rank} {cluster} {fwd}/{bwd} hierarchical={hierarchical} {kind}"
        assert set(forward.by_collective) <= {"all_to_all_single"}, label
        assert (
            LinkBytes(intra=forward.intra_host_bytes, inter=forward.inter_host_bytes)
            == expected.forward
        ), label
        assert (
            LinkBytes(intra=backward.intra_host_bytes, inter=backward.inter_host_bytes)
            == expected.backward
        ), label
        assert expected.forward.intra + expected.forward.inter > 0, label


@pytest.mark.multiprocess
@pytest.mark.parametrize("world", [2, 4])
def test_analytic_bytes_match_the_counter(world: int) -> None:
    run_gloo_ranks(_measure, world)


def test_hierarchy_regroups_ub_traffic_and_reduces_rb_partials_inside_hosts() -> None:
    inter = {}
    for cluster in ("rb", "ub"):
        for hierarchical in (False, True):
            scenario = all_layouts_plan(4, RANKS_PER_HOST, cluster, hierarchical=hierarchical)
            batches = random_batches(scenario, [4, 4, 4, 4], seed=3)
            steps = analytic_bytes(scenario.plan, scenario.tables, batches)
            inter[(cluster, hierarchical)] = sum(s.forward.inter + s.backward.inter for s in steps)
    # UB: the same unique rows cross hosts, only regrouped.
    assert inter[("ub", True)] == inter[("ub", False)]
    # RB: partial sums of row shards on one host cross once (all-layouts plan: a third less).
    assert inter[("rb", True)] < 0.8 * inter[("rb", False)]
