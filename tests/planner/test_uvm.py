"""UVM caching in the planner: the Zipf miss formula, its pricing, and plans that only
fit HBM with caches (:mod:`lightning_embark.planner._uvm`)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from lightning_embark.errors import PlanInfeasibleError
from lightning_embark.plan import ClusterPlan, ClusterType, TableLayout
from lightning_embark.plan._cache import hbm_block_bytes
from lightning_embark.planner import CostModel, GreedyPlanner
from lightning_embark.planner._greedy_config import GreedyConfig
from lightning_embark.planner._hardware import load_calibration
from lightning_embark.planner._terms import LOOKUP, MEM, TableLoad, TermModel
from lightning_embark.planner._uvm import (
    EXACT_TERMS,
    cached_tables,
    generalized_harmonic,
    miss_rate,
    miss_seconds,
    uvm_enabled,
)
from lightning_embark.spec import IdDistribution, ModelSpec, TableSpec, load_spec

#: Euler-Maclaurin's remainder after the B_2 term is at most 6e-10 for any alpha (see
#: generalized_harmonic); numpy's pairwise sum of 2e5 terms adds ~ log2(2e5) * 1.1e-16 * H
#: < 1e-12 relative. So H is compared within 1e-9 absolute, and a miss rate
#: ``1 - H_C / H_N`` (both errors over ``H_N >= 1``) within 2e-9.
H_TOL = 1e-9
MISS_TOL = 2e-9


def _exact_h(n: int, alpha: float) -> float:
    return float(np.sum(np.arange(1, n + 1, dtype=np.float64) ** -alpha))


@pytest.mark.parametrize("alpha", [0.16, 0.5, 1.0, 1.1, 2.0])
@pytest.mark.parametrize("n", [1, EXACT_TERMS, EXACT_TERMS + 1, 5_000, 200_000])
def test_generalized_harmonic_matches_the_direct_sum(n: int, alpha: float) -> None:
    assert generalized_harmonic(n, alpha) == pytest.approx(_exact_h(n, alpha), abs=H_TOL, rel=0)


@pytest.mark.parametrize("alpha", [0.5, 1.0, 1.1, 1.5])
def test_the_miss_rate_is_the_mass_outside_the_top_c_rows(alpha: float) -> None:
    """Checked against the Zipf probabilities summed directly over N = 200000 rows."""
    n = 200_000
    p = np.arange(1, n + 1, dtype=np.float64) ** -alpha
    p /= p.sum()
    for c in (1, 100, 1024, 1025, 20_000, 199_999):
        assert miss_rate(c, n, alpha) == pytest.approx(float(p[c:].sum()), abs=MISS_TOL, rel=0)
    assert miss_rate(n, n, alpha) == 0.0 and miss_rate(0.5, n, alpha) == 1.0


def test_uniform_ids_miss_in_proportion_to_the_uncached_rows() -> None:
    assert miss_rate(250, 1000, None) == 0.75


def test_a_cached_block_stores_its_cache_and_pays_its_misses_over_the_host_link() -> None:
    calib = load_calibration("dgx-h100")
    assert uvm_enabled(calib) and not uvm_enabled(load_calibration("emulated"))
    terms = TermModel(calib, num_hosts=1, ranks_per_host=2)
    load = TableLoad(batch=1024, hotness=4.0, unique=2000.0, dim=64, rows=1_000_000, alpha=1.1)
    cluster = ClusterPlan(name="rb", type=ClusterType.RB)
    plain = terms.sharded(load, cluster, 1, 1, ((0,),))
    cached = terms.sharded(load, cluster, 1, 1, ((0,),), cache_load_factor=0.1)
    assert (
        cached[MEM, 0]
        == hbm_block_bytes(1_000_000, 64, 0.1, element_bytes=4.0, row_bytes=4.0)
        < plain[MEM, 0]
    )
    # both ranks request: 2 * B * h reads, at most 2 * U distinct rows
    extra = miss_seconds(
        calib,
        cache_load_factor=0.1,
        block_rows=1_000_000,
        width=64,
        accesses=2 * 1024 * 4.0,
        distinct=2 * 2000.0,
        alpha=1.1,
    )
    miss = miss_rate(100_000, 1_000_000, 1.1)
    assert extra == pytest.approx(min(4000.0, miss * 8192) * 64 * 4 / 64e9)
    assert cached[LOOKUP, 0] - plain[LOOKUP, 0] == pytest.approx(extra)
    np.testing.assert_array_equal(
        np.delete(cached, [LOOKUP, MEM], 0), np.delete(plain, [LOOKUP, MEM], 0)
    )


def _hugectr_470b() -> ModelSpec:
    """The largest HugeCTR spec (510 tables, 114.6B parameters) with every table's rows
    scaled to 470B parameters, EMBark's largest model."""
    spec = load_spec("hugectr-510table-110B-hotness5")
    scale = 470e9 / sum(t.num_embeddings * t.embedding_dim for t in spec.tables)
    tables = tuple(
        dataclasses.replace(t, num_embeddings=max(1, round(t.num_embeddings * scale)))
        for t in spec.tables
    )
    return dataclasses.replace(spec, name="hugectr-510table-470B", tables=tables)


def test_the_470b_model_plans_on_two_dgx_h100_hosts_with_uvm_caches() -> None:
    spec = _hugectr_470b()
    params = sum(t.num_embeddings * t.embedding_dim for t in spec.tables)
    assert params == pytest.approx(470e9, rel=1e-6)
    calib = load_calibration("dgx-h100")
    model = CostModel(spec, calib, num_hosts=2, ranks_per_host=8, batch_size=8192)
    assert calib.memory_per_rank is not None and calib.host_memory_per_rank is not None
    # no HBM-only plan exists: storing each table once overflows all 16 GPUs' HBM
    once = sum(model.terms.element_bytes(t.num_embeddings, t.embedding_dim) for t in spec.tables)
    assert once > 16 * calib.memory_per_rank
    assert once < 0.9 * 16 * calib.host_memory_per_rank  # but host memory holds it
    result = GreedyPlanner(GreedyConfig(targets=(1.0,))).plan(model)
    plan = result.plan
    plan.validate(
        spec,
        calib.topology(num_hosts=2, ranks_per_host=8),
        bytes_per_row_element=calib.bytes_per_element,
    )
    assert cached_tables(plan)
    factors = [t.cache_load_factor for t in plan.tables if t.cache_load_factor is not None]
    assert all(0 < f < 1 for f in factors)
    assert result.estimate.max_memory_bytes <= calib.memory_per_rank
    assert "UVM caching" in result.notes[-1]
    uncached = dataclasses.replace(
        plan,
        tables=tuple(dataclasses.replace(t, cache_load_factor=None) for t in plan.tables),
    )
    assert result.estimate.step_time_ms > model.estimate(uncached).step_time_ms  # misses cost


def _small(alpha_kind: str = "zipf") -> ModelSpec:
    return ModelSpec(
        name="small",
        tables=tuple(
            TableSpec(name=f"t{i}", num_embeddings=200_000, embedding_dim=64, pooling_factor=2.0)
            for i in range(4)
        ),
        id_distribution=IdDistribution(kind=alpha_kind, alpha=1.1),
    )


def test_only_gpu_hardware_caches_and_the_option_turns_it_off() -> None:
    """4 tables of 200000 x 64 fp32 (+ a row-wise state): 205 MB stored once, on 2 ranks
    of 60 MB each: too small for HBM, cached on GPU hardware, infeasible on CPUs."""
    spec = _small()
    gpu = dataclasses.replace(load_calibration("dgx-h100"), memory_per_rank=60e6)
    cpu = dataclasses.replace(load_calibration("emulated"), memory_per_rank=60e6)
    result = GreedyPlanner().plan(
        CostModel(spec, gpu, num_hosts=1, ranks_per_host=2, batch_size=256)
    )
    assert cached_tables(result.plan) and result.estimate.max_memory_bytes <= 60e6
    for calib, config in ((cpu, GreedyConfig()), (gpu, GreedyConfig(uvm_caching=False))):
        with pytest.raises(PlanInfeasibleError, match="does not fit"):
            GreedyPlanner(config).plan(
                CostModel(spec, calib, num_hosts=1, ranks_per_host=2, batch_size=256)
            )


def test_a_rank_whose_uncacheable_part_overflows_hbm_is_infeasible() -> None:
    """Cache indices and row-wise state (8 bytes per row: 3.2 MB per rank for its 400000
    rows, however the 4 tables are laid out on 2 ranks) alone overflow 3 MB."""
    gpu = dataclasses.replace(load_calibration("dgx-h100"), memory_per_rank=3e6)
    with pytest.raises(
        PlanInfeasibleError, match=r"even with every sharded block cached.*short by"
    ):
        GreedyPlanner().plan(
            CostModel(_small(), gpu, num_hosts=1, ranks_per_host=2, batch_size=256)
        )


def test_layouts_keep_their_factor_through_replace() -> None:
    layout = TableLayout(table="t", cluster="rb", ranks=((0,),), cache_load_factor=0.5)
    assert dataclasses.replace(layout, cluster="ub").cache_load_factor == 0.5
    assert math.isclose(layout.cache_load_factor or 0, 0.5)
