"""A table layout's HBM cache share (``cache_load_factor``): validation, JSON, memory.

HBM bytes are hand-computed integers (:mod:`lightning_embark.plan._cache`), so shortfalls
are compared with ``==``.
"""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from lightning_embark.errors import ConfigError, PlanInfeasibleError
from lightning_embark.plan._cache import CACHE_INDEX_BYTES, CACHE_SLOT_BYTES, hbm_block_bytes
from lightning_embark.plan._types import ClusterPlan, ClusterType, Plan, TableLayout
from lightning_embark.spec import ModelSpec, TableSpec
from lightning_embark.topology import Topology

SPEC = ModelSpec(
    name="m",
    tables=(TableSpec(name="big", num_embeddings=1000, embedding_dim=8, pooling_factor=1.0),),
)


def _plan(factor: float | None, cluster: ClusterType = ClusterType.RB) -> Plan:
    dp = cluster is ClusterType.DP
    return Plan(
        world_size=2,
        ranks_per_host=2,
        clusters=(ClusterPlan(name="c", type=cluster),),
        tables=(
            TableLayout(
                table="big",
                cluster="c",
                num_replicas=2 if dp else 1,
                num_row_shards=1 if dp else 2,
                ranks=((0,), (1,)) if dp else ((0, 1),),
                cache_load_factor=factor,
            ),
        ),
    )


def _topology(memory: int) -> Topology:
    return Topology(
        name="t",
        num_hosts=1,
        ranks_per_host=2,
        memory_per_rank=memory,
        intra_host_bandwidth=1e9,
        inter_host_bandwidth=1e9,
    )


@pytest.mark.parametrize("bad", [0, 0.0, -0.5, 1.5, math.nan, math.inf, True, "0.5"])
def test_a_factor_outside_zero_one_is_refused_naming_the_table_and_value(bad) -> None:
    with pytest.raises(ConfigError, match=r"table 'big': cache_load_factor must be .*\(0, 1\]"):
        _plan(bad)


def test_the_factor_round_trips_and_old_json_still_loads() -> None:
    cached = _plan(0.25)
    again = Plan.from_dict(json.loads(json.dumps(cached.to_dict())))
    assert again == cached and again.tables[0].cache_load_factor == 0.25
    plain = _plan(None).to_dict()  # an uncached plan writes the JSON it wrote before
    assert "cache_load_factor" not in plain["tables"][0]
    assert Plan.from_dict(plain).tables[0].cache_load_factor is None
    assert _plan(1).tables[0].cache_load_factor == 1.0  # ints are accepted as floats


def test_dp_tables_cannot_be_cached() -> None:
    with pytest.raises(ConfigError, match=r"DP cluster 'c' with cache_load_factor=0.5"):
        _plan(0.5, ClusterType.DP).validate(SPEC)
    _plan(1.0, ClusterType.DP).validate(SPEC)  # 1: wholly in HBM, as without a factor


def test_validate_counts_the_cache_and_its_metadata_not_the_uvm_rows() -> None:
    """Each rank holds a 500 x 8 block at 4 bytes: 16000 bytes in HBM; cached at 1/4,
    125 slots of 8 * 4 + 16 bytes plus 4 bytes of cache index per row: 8000 bytes."""
    rows, width = 500, 8
    full = rows * width * 4
    cached = 125 * (width * 4 + CACHE_SLOT_BYTES) + rows * CACHE_INDEX_BYTES
    assert hbm_block_bytes(rows, width, 0.25, element_bytes=4) == cached == 8000
    assert hbm_block_bytes(rows, width, None, element_bytes=4) == full
    _plan(0.25).validate(SPEC, _topology(cached))
    with pytest.raises(PlanInfeasibleError) as info:
        _plan(None).validate(SPEC, _topology(cached))
    assert info.value.shortfall_bytes == full - cached
    with pytest.raises(PlanInfeasibleError) as info:
        _plan(0.25).validate(SPEC, _topology(cached - 1))
    assert info.value.shortfall_bytes == 1


def test_replace_keeps_the_check() -> None:
    with pytest.raises(ConfigError, match="cache_load_factor"):
        dataclasses.replace(_plan(None).tables[0], cache_load_factor=2.0)


def test_the_summary_shows_a_cached_tables_share() -> None:
    from lightning_embark.plan import plan_summary

    assert "uvm_cache=0.25" in plan_summary(_plan(0.25))
    assert "uvm_cache" not in plan_summary(_plan(None))
