"""Analytic bytes per step equal what the byte counter measures, exactly, per rank and link."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from lightning_embark.accounting import CommCounter, counting_collectives
from lightning_embark.engine import EngineConfig, LinkBytes, analytic_bytes
from lightning_embark.engine._optimizer import OptimizerKind, SparseOptimizer
from lightning_embark.plan import layouts
from lightning_embark.plan._types import Compression
from lightning_embark.testing._ranks import run_gloo_ranks
from lightning_embark.testing._scenarios import all_layouts_plan, random_batches
from lightning_embark.testing._tower_scenarios import towers_plan
from lightning_embark.torchrec_modules import ShardedEmbeddingBagCollection

RANKS_PER_HOST = 2
#: The plain engine: the counter's window of a phase must hold that phase's collectives, and
#: an overlapped engine's backward exchanges run on past the step (into the next window).
PER_PHASE = EngineConfig(pipeline=False, overlap=False)

CASES = [
    # (cluster, forward, backward, hierarchical, optimizer, weighted)
    ("rb", Compression.FP32, Compression.FP32, False, OptimizerKind.SGD, False),
    ("rb", Compression.FP8, Compression.BF16, True, OptimizerKind.ROWWISE_ADAGRAD, True),
    ("ub", Compression.INT8, Compression.FP16, False, OptimizerKind.ROWWISE_ADAGRAD, False),
    ("ub", Compression.FP32, Compression.FP8, True, OptimizerKind.ADAGRAD, False),
]


def _count_step(sharded: Any, batch: Any, rank: int, ranks_per_host: int) -> tuple[Any, Any]:
    """What this rank sends in one forward and one backward pass of ``sharded``."""
    counter = CommCounter(rank=rank, ranks_per_host=ranks_per_host)
    with counting_collectives(counter):
        out = sharded(batch)
        forward = counter.reset()
        out.values().sum().backward()
        backward = counter.reset()
    return forward, backward


def _assert_counted(forward: Any, backward: Any, expected: Any, label: str) -> None:
    """The counter's intra-/inter-host bytes of a forward and a backward pass equal the
    analytic ones, exactly."""
    assert (
        LinkBytes(intra=forward.intra_host_bytes, inter=forward.inter_host_bytes)
        == expected.forward
    ), label
    assert (
        LinkBytes(intra=backward.intra_host_bytes, inter=backward.inter_host_bytes)
        == expected.backward
    ), label


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
            config=PER_PHASE,
        )
        sizes = [5, 0, 7, 3][:world]
        batches = random_batches(scenario, sizes, seed=7, weighted=weighted)
        expected = analytic_bytes(
            scenario.plan, scenario.tables, batches, is_weighted=weighted, optimizer=kind
        )[rank]
        forward, backward = _count_step(sharded, batches[rank], rank, RANKS_PER_HOST)
        label = f"rank {rank} {cluster} {fwd}/{bwd} hierarchical={hierarchical} {kind}"
        assert set(forward.by_collective) <= {"all_to_all_single"}, label
        _assert_counted(forward, backward, expected, label)
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


TOWER_CASES = [
    # (ranks per host, module, compression, only DP outside the towers)
    (2, "identity", Compression.FP32, False),
    (2, "projection", Compression.FP16, True),
    (1, "dcn", Compression.FP8, False),
]


def _measure_towers(rank: int, world: int) -> None:
    for local, module, compression, dp_only in TOWER_CASES:
        scenario = towers_plan(
            world,
            local,
            module=module,
            output_dim=None if module == "identity" else 6,
            compression=compression,
        )
        plan = scenario.plan
        if dp_only:
            plan = dataclasses.replace(
                plan,
                tables=tuple(
                    layouts.data_parallel("e", "flatdp", world) if t.table == "e" else t
                    for t in plan.tables
                ),
            )
        kind = OptimizerKind.ROWWISE_ADAGRAD
        sharded = ShardedEmbeddingBagCollection(
            scenario.tables, plan, sparse_optimizer=SparseOptimizer(kind=kind), config=PER_PHASE
        )
        batches = random_batches(scenario, [5, 0, 7, 3][:world], seed=11)
        expected = analytic_bytes(plan, scenario.tables, batches, optimizer=kind)[rank]
        forward, backward = _count_step(sharded, batches[rank], rank, local)
        label = f"rank {rank} towers {local} per host, {module}, {compression}, dp_only={dp_only}"
        _assert_counted(forward, backward, expected, label)
        assert {"towers:ids", "towers:outputs", "towers:modules"} <= set(expected.by_cluster)


@pytest.mark.multiprocess
def test_analytic_tower_bytes_match_the_counter() -> None:
    run_gloo_ranks(_measure_towers, 4)


def test_compressing_towers_cut_the_output_bytes_across_hosts() -> None:
    """Identity towers send each feature's 8 fp32 values per sample back; a projection to
    6 fp16 values per tower sends ``6 * 2`` bytes per sample and tower instead."""
    scenario = towers_plan(4, 2)
    batches = random_batches(scenario, [4, 4, 4, 4], seed=3)
    identity = analytic_bytes(scenario.plan, scenario.tables, batches)
    small = towers_plan(4, 2, module="projection", output_dim=6, compression="fp16")
    projected = analytic_bytes(small.plan, small.tables, batches)

    def outputs(steps: list) -> int:
        return sum(s.by_cluster["towers:outputs"][0].inter for s in steps)

    # t0 (3 features) on host 0, t1 (2 tables, 3 features) on host 1: each of the 16
    # samples gets 3 * 8 * 4 bytes from the tower on the other host (identity), 6 * 2
    # projected.
    assert outputs(identity) == 16 * 3 * 8 * 4
    assert outputs(projected) == 16 * 6 * 2
