"""Unique-row paths: gather-and-pack and unpack-index-add, kernels vs. reference vs. exact."""

from __future__ import annotations

import math

import pytest
import torch

from lightning_embark.engine.codecs import CODECS, INT8, Codec
from lightning_embark.errors import ConfigError
from lightning_embark.kernels import ExchangeLayout, RankSlice, gather_pack, unpack_index_add

FORMATS = list(CODECS.values())
NUM_ROWS, NUM_COLS = 11, 9
BLOCKS = ((0, 5), (5, 4))


def ub_layout() -> tuple[ExchangeLayout, torch.Tensor]:
    """Three requesters' unique rows of one table (two column blocks) at the owner.

    Rows 3 and 0 are asked for by several requesters (several gradients to sum),
    requester 1 asks for row 10 twice (duplicates inside one segment also sum in
    order), requester 2 asks for nothing, and requester 3 only for the second block.
    """
    indices = torch.tensor([3, 0, 7, 10, 3, 10, 0, 3, 5, 1])
    layout = ExchangeLayout(
        ranks=(
            RankSlice(row_start=0, row_stop=3, blocks=BLOCKS),
            RankSlice(row_start=3, row_stop=7, blocks=BLOCKS),
            RankSlice(row_start=7, row_stop=7, blocks=BLOCKS),
            RankSlice(row_start=7, row_stop=10, blocks=(BLOCKS[1],)),
        ),
        num_rows=indices.numel(),
        num_cols=NUM_COLS,
    )
    return layout, indices


@pytest.mark.parametrize("codec", FORMATS, ids=lambda c: c.name)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_unique_paths_match_reference_and_bounds(codec: Codec, dtype: torch.dtype, triton_cpu: str) -> None:
    layout, indices = ub_layout()
    g = torch.Generator().manual_seed(FORMATS.index(codec))
    weights = (torch.randn(NUM_ROWS, NUM_COLS, generator=g) * 4).to(dtype)
    weights[5, 6] = math.inf  # gathered once (requester 3, second block)
    weights[7, 1] = math.nan  # gathered once (requester 1, first block)

    payload, count = gather_pack(weights, indices, layout, codec, backend=triton_cpu)
    expected, expected_count = gather_pack(weights, indices, layout, codec, backend="reference")
    assert torch.equal(payload, expected)
    assert int(count) == int(expected_count) == 2

    # Backward: the same bytes read as per-unique-row gradients, accumulated per row.
    grads = unpack_index_add(payload, indices.int(), layout, codec, num_rows=NUM_ROWS, backend=triton_cpu)
    assert grads.shape == (NUM_ROWS, NUM_COLS) and grads.dtype == torch.float32
    assert torch.equal(
        grads, unpack_index_add(payload, indices, layout, codec, num_rows=NUM_ROWS, backend="reference")
    )
    assert torch.all(grads[[2, 4, 6, 8, 9]] == 0)  # rows nobody asked for

    clean = weights.float().nan_to_num(nan=0.0, posinf=0.0)
    exact, bound = torch.zeros(NUM_ROWS, NUM_COLS), torch.zeros(NUM_ROWS, NUM_COLS)
    for part in layout.ranks:
        for block in part.blocks:
            rows = indices[part.row_start : part.row_stop]
            cols = slice(block.start, block.stop)
            exact[:, cols].index_add_(0, rows, clean[rows, cols])
            bound[:, cols].index_add_(0, rows, codec.bound.limit(clean[rows, cols]))
    finite = torch.ones(NUM_ROWS, NUM_COLS, dtype=torch.bool)
    finite[5, 5:], finite[7, :5] = False, False  # blocks whose scale saw the inf / nan
    assert torch.all(((grads - exact).abs() <= bound)[finite])


def test_duplicate_contributions_sum_in_buffer_order(triton_cpu: str) -> None:
    """Many contributions to one row: exactly the sequential index_add result."""
    indices = torch.tensor([2] * 7 + [0])
    layout = ExchangeLayout.from_row_splits([3, 4, 1], [(0, 3)], num_cols=3)
    rows = torch.tensor([[1e8, 1.0, -3.0], [0.0, 0.0, 0.0], [1e-3, 7.0, 2.0]])
    payload, _ = gather_pack(rows, indices, layout, "fp32", backend="reference")
    values = payload.view(torch.float32).view(-1, 3)
    sequential = torch.zeros(3, 3)
    for i, target in enumerate(indices.tolist()):
        sequential[target] += values[i]
    got = unpack_index_add(payload, indices, layout, "fp32", num_rows=3, backend=triton_cpu)
    assert torch.equal(got, sequential)


def test_unique_input_errors() -> None:
    layout, indices = ub_layout()
    weights = torch.zeros(NUM_ROWS, NUM_COLS)
    with pytest.raises(ConfigError, match="indices span"):
        gather_pack(weights[:8], indices, layout, INT8, backend="reference")
    with pytest.raises(ConfigError, match="length 10"):
        gather_pack(weights, indices[:4], layout, INT8, backend="reference")
    with pytest.raises(ConfigError, match="1-D int32/int64"):
        gather_pack(weights, indices.float(), layout, INT8, backend="reference")
    payload, _ = gather_pack(weights, indices, layout, INT8, backend="reference")
    with pytest.raises(ConfigError, match="indices span"):
        unpack_index_add(payload, indices, layout, INT8, num_rows=8, backend="reference")


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_overlapping_column_blocks_are_rejected(backend: str, request: pytest.FixtureRequest) -> None:
    if backend == "triton":
        request.getfixturevalue("triton_cpu")
    indices = torch.tensor([0, 1])
    layout = ExchangeLayout(
        ranks=(
            RankSlice(row_start=0, row_stop=1, blocks=((0, 4),)),
            RankSlice(row_start=1, row_stop=2, blocks=((2, 4),)),
        ),
        num_rows=2,
        num_cols=6,
    )
    payload = torch.zeros(layout.total_bytes(INT8), dtype=torch.uint8)
    with pytest.raises(ConfigError, match="identical or disjoint"):
        unpack_index_add(payload, indices, layout, INT8, num_rows=2, backend=backend)
