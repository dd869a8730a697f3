"""The layout space: balanced layouts cost every rank the same, and placement keeps to
the memory limit."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lightning_embark.errors import PlanInfeasibleError
from lightning_embark.plan import ClusterType, Compression
from lightning_embark.planner._cost import CostModel
from lightning_embark.planner._hardware import load_calibration
from lightning_embark.planner._space import Layout, Space, SpaceConfig, flag_choices
from lightning_embark.planner._split import Shape
from lightning_embark.spec import ModelSpec, TableSpec

HOSTS, LOCAL, BATCH = 2, 4, 256
WORLD = HOSTS * LOCAL


def _space(*tables: TableSpec, limit: float = 1e12, dp: bool = True) -> Space:
    calib = load_calibration("dgx-h100")
    model = CostModel(
        ModelSpec(name="s", tables=tables),
        calib,
        num_hosts=HOSTS,
        ranks_per_host=LOCAL,
        batch_size=BATCH,
    )
    shape = Shape(calib, num_hosts=HOSTS, ranks_per_host=LOCAL, compression=Compression.FP32)
    config = SpaceConfig(compression=Compression.FP32, dp=dp, hierarchical=None, min_col_width=16)
    return Space(model, shape, config, limit=limit)


TABLE = TableSpec(name="t", num_embeddings=100_003, embedding_dim=64, pooling_factor=6.0)


@pytest.mark.parametrize("hierarchical", [False, True])
def test_a_balanced_layout_costs_every_rank_the_same(hierarchical: bool) -> None:
    """One block per rank: each rank holds one block, requests the other 7, each host
    holds 4 blocks, so stored bytes and buffers are equal on every rank (to rounding)."""
    space = _space(TABLE)
    layouts = space.balanced_layouts(0)
    # DP, then RB and UB as (8, 1), (4, 2), (2, 4) (columns of 64 / c >= 16 wide)
    assert [(o.type, o.k, o.c) for o in layouts] == [
        (ClusterType.DP, 1, 1),
        *((kind, k, WORLD // k) for kind in (ClusterType.RB, ClusterType.UB) for k in (2, 4, 8)),
    ]
    for layout in layouts:
        if layout.type is not ClusterType.DP:
            assert sorted(layout.ranks) == list(range(WORLD))
        memory = space.model.memory(space.terms(0, layout, hierarchical))
        assert np.ptp(memory) <= 1e-9 * memory.max()


def test_flat_row_wise_memory_is_the_hand_count() -> None:
    """RB split over all 8 ranks, flat, fp32, row-wise Adagrad: a rank stores
    ``ceil(rows / 8)`` rows of ``64 * 4 + 4`` bytes and receives, from each of the 7
    others, ``B`` pooled rows (``4 * 64`` bytes each) as a requester and, as an owner,
    ``B`` lengths plus ``B h / 8`` IDs (4 bytes each) and ``B`` gradient rows."""
    space = _space(TABLE)
    layout = Layout(type=ClusterType.RB, k=WORLD, c=1, ranks=tuple(range(WORLD)))
    memory = space.model.memory(space.terms(0, layout, False))
    stored = math.ceil(TABLE.num_embeddings / WORLD) * (64 * 4 + 4)
    received = (WORLD - 1) * (BATCH * 256 + 4 * BATCH * (1 + 6.0 / WORLD) + BATCH * 256)
    assert memory == pytest.approx(np.full(WORLD, stored + received), rel=1e-12)


def test_tables_with_fewer_rows_than_ranks_have_no_balanced_split() -> None:
    """7 rows of 16 (one column shard at the minimum width of 16) cannot make 8 blocks."""
    tiny = TableSpec(name="tiny", num_embeddings=WORLD - 1, embedding_dim=16, pooling_factor=1.0)
    assert [o.type for o in _space(tiny).balanced_layouts(0)] == [ClusterType.DP]
    assert _space(tiny, dp=False).balanced_layouts(0) == []


def test_flags_follow_the_greedys_setting() -> None:
    assert flag_choices(1, None) == (False,)
    assert flag_choices(2, None) == (False, True)
    assert flag_choices(2, False) == (False,)
    assert flag_choices(2, True) == (True,)


def test_place_keeps_every_rank_within_the_limit() -> None:
    """A whole table of 100,003 rows x 260 bytes (26.0 MB) fits a limit of 30 MB on one
    rank and not one of 20 MB: placing returns None, or with ``strict`` raises naming
    the table and how much is missing."""
    empty = np.zeros((11, WORLD))
    roomy = _space(TABLE, limit=30e6)
    placed = roomy.place(0, ClusterType.RB, 1, 1, empty, seconds=1.0, roomiest=True)
    assert placed is not None
    layout, terms = placed
    assert len(layout.ranks) == 1
    assert roomy.model.memory(terms).max() <= 30e6
    tight = _space(TABLE, limit=20e6)
    assert tight.place(0, ClusterType.RB, 1, 1, empty, seconds=1.0, roomiest=True) is None
    with pytest.raises(PlanInfeasibleError, match=r"table 't' does not fit.*short by") as info:
        tight.place(0, ClusterType.RB, 1, 1, empty, seconds=1.0, roomiest=True, strict=True)
    assert info.value.table == "t" and info.value.shortfall_bytes > 6e6
