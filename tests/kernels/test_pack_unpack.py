"""Quantise-and-pack and unpack-dequantise-reduce: kernels vs. reference vs. exact sums."""

from __future__ import annotations

import math
import random

import pytest
import torch

from lightning_embark.errors import ConfigError
from lightning_embark.kernels import ColumnBlock, ExchangeLayout, RankSlice, pack, unpack_reduce
from lightning_embark.kernels import _packing as pack_module
from lightning_embark.kernels import _unpacking as unpack_module
from lightning_embark.kernels._exchange_layout import iter_segments
from lightning_embark.wire._codecs import CODECS, FP8_E4M3, INT8, Codec

FORMATS = list(CODECS.values())
SCALED = {"fp8_e4m3", "fp8_e5m2", "int8"}


def rb_layouts(seed: int) -> tuple[ExchangeLayout, ExchangeLayout, list[list[tuple[int, int]]]]:
    """An RB exchange seen from one requester: (stacked send layout, receive layout, blocks).

    Source ``s`` sends rows ``[0, B)`` of a random subset of the column blocks in a
    random order; sources sending the same block are row shards to be summed. The
    send layout reads source ``s``'s values from rows ``[s*B, (s+1)*B)`` of one
    stacked tensor, so its segments line up with the receive layout's. The last
    source sends nothing (zero rows).
    """
    rng = random.Random(seed)
    widths = [rng.choice([1, 3, 5, 7, 9, 13]) for _ in range(3)]
    starts = [sum(widths[:i]) for i in range(3)]
    blocks = [(s, w) for s, w in zip(starts, widths, strict=True)]
    batch, sources = rng.randint(1, 7), 3
    chosen = [rng.sample(blocks, rng.randint(1, 3)) for _ in range(sources)]
    cols = sum(widths)
    send = ExchangeLayout(
        ranks=(
            *tuple(
                RankSlice(row_start=s * batch, row_stop=(s + 1) * batch, blocks=tuple(b))
                for s, b in enumerate(chosen)
            ),
            RankSlice(row_start=0, row_stop=0, blocks=(blocks[0],)),
        ),
        num_rows=sources * batch,
        num_cols=cols,
    )
    recv = ExchangeLayout(
        ranks=(
            *tuple(RankSlice(row_start=0, row_stop=batch, blocks=tuple(b)) for b in chosen),
            RankSlice(row_start=0, row_stop=0, blocks=(blocks[0],)),
        ),
        num_rows=batch,
        num_cols=cols,
    )
    return send, recv, chosen


def random_rows(seed: int, rows: int, cols: int, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g) * torch.exp(torch.randn(rows, 1, generator=g) * 2)
    return x.to(dtype)


def expected_sum_and_bound(
    x: torch.Tensor, chosen: list[list[tuple[int, int]]], batch: int, cols: int, codec: Codec
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact sum of the row-shard partials and the summed per-block error bounds."""
    total, bound = torch.zeros(batch, cols), torch.zeros(batch, cols)
    for s, blocks in enumerate(chosen):
        for c0, w in blocks:
            part = x[s * batch : (s + 1) * batch, c0 : c0 + w].float()
            total[:, c0 : c0 + w] += part
            bound[:, c0 : c0 + w] += codec.bound.limit(part)
    return total, bound


@pytest.mark.parametrize("codec", FORMATS, ids=lambda c: c.name)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_kernels_match_reference_and_bounds(
    codec: Codec, dtype: torch.dtype, triton_cpu: str
) -> None:
    seed = (
        17 * FORMATS.index(codec) + {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}[dtype]
    )
    send, recv, chosen = rb_layouts(seed)
    x = random_rows(seed, send.num_rows, send.num_cols, dtype)
    if dtype is torch.float16 or codec.name == "fp16":
        x = x.float().clamp(-6e4, 6e4).to(dtype)

    payload, count = pack(x, send, codec, backend=triton_cpu)
    expected, expected_count = pack(x, send, codec, backend="reference")
    assert payload.dtype == torch.uint8 and payload.numel() == send.total_bytes(codec)
    assert torch.equal(payload, expected)
    assert int(count) == int(expected_count) == 0
    assert send.split_bytes(codec)[-1] == 0

    out = unpack_reduce(payload, recv, codec, backend=triton_cpu)
    assert out.dtype == torch.float32 and tuple(out.shape) == (recv.num_rows, recv.num_cols)
    assert torch.equal(out, unpack_reduce(payload, recv, codec, backend="reference"))
    total, bound = expected_sum_and_bound(x, chosen, recv.num_rows, recv.num_cols, codec)
    assert torch.all((out - total).abs() <= bound)


@pytest.mark.parametrize("codec", FORMATS, ids=lambda c: c.name)
def test_wide_rows_loop_over_column_chunks(
    codec: Codec, triton_cpu: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows wider than one tile take the multi-chunk path (two passes for scaled formats)."""
    monkeypatch.setattr(pack_module, "MAX_BLOCK_W", 4)
    monkeypatch.setattr(unpack_module, "MAX_BLOCK_W", 4)
    layout = ExchangeLayout.from_row_splits([2, 3], [(0, 11), (11, 6)], num_cols=17)
    x = random_rows(5, 5, 17, torch.float32)
    x[1, 9] = math.inf  # in the last chunk: the scale must still ignore it
    payload, count = pack(x, layout, codec, backend=triton_cpu)
    expected, _ = pack(x, layout, codec, backend="reference")
    assert torch.equal(payload, expected) and int(count) == 1
    assert torch.equal(
        unpack_reduce(payload, layout, codec, backend=triton_cpu),
        unpack_reduce(payload, layout, codec, backend="reference"),
    )


@pytest.mark.parametrize("codec", FORMATS, ids=lambda c: c.name)
def test_power_of_two_widths_take_the_unmasked_path(codec: Codec, triton_cpu: str) -> None:
    """Every width equal to the tile width: column masks are dropped (vectorisable)."""
    send = ExchangeLayout.from_row_splits([3, 2], [(0, 8), (8, 8)], num_cols=16)
    recv = ExchangeLayout(
        ranks=(RankSlice(row_start=0, row_stop=3, blocks=((8, 8), (0, 8))),) * 2
        + (RankSlice(row_start=3, row_stop=5, blocks=((0, 8),)),),
        num_rows=5,
        num_cols=16,
    )
    x = random_rows(23, 5, 16, torch.float32)
    x[4, 3] = math.nan
    payload, count = pack(x, send, codec, backend=triton_cpu)
    expected, _ = pack(x, send, codec, backend="reference")
    assert torch.equal(payload, expected) and int(count) == 1
    received = torch.cat(
        [payload[: send.split_bytes(codec)[0]]] * 2
        + [payload[send.split_bytes(codec)[0] :][: 2 * codec.row_bytes(8)]]
    )
    assert torch.equal(
        unpack_reduce(received, recv, codec, backend=triton_cpu),
        unpack_reduce(received, recv, codec, backend="reference"),
    )


@pytest.mark.parametrize("codec", FORMATS, ids=lambda c: c.name)
def test_nonfinite_policy_in_kernels(codec: Codec, triton_cpu: str) -> None:
    layout = ExchangeLayout.from_row_splits([2, 2], [(0, 5), (5, 4)], num_cols=9)
    x = random_rows(11, 4, 9, torch.float32)
    x[0, 1], x[0, 2], x[1, 6], x[2, 0] = math.inf, -math.inf, math.nan, math.nan
    x[3, 5:] = math.inf  # a block row with no finite value
    payload, count = pack(x, layout, codec, backend=triton_cpu)
    expected, _ = pack(x, layout, codec, backend="reference")
    assert torch.equal(payload, expected)
    assert int(count) == 8
    out = unpack_reduce(payload, layout, codec, backend=triton_cpu)
    assert torch.isfinite(out).all()
    if codec.name in SCALED:
        # NaN encodes as 0 (within a quantisation step), inf as the row's extremes.
        assert abs(out[1, 6]) <= codec.bound.limit(x[1:2, 5:].nan_to_num(0.0)).max()
        assert out[0, 1] == out[0, :5].max() and out[0, 2] == out[0, :5].min()
        assert torch.all(out[3, 5:] == 0.0)  # nothing finite to scale by
    else:
        assert out[1, 6] == 0.0 and out[2, 0] == 0.0
        assert (
            out[0, 1] == codec.fmax
            and out[0, 2] == -codec.fmax
            and torch.all(out[3, 5:] == codec.fmax)
        )


def test_zero_rows_and_empty_layouts(triton_cpu: str) -> None:
    empty = ExchangeLayout.from_row_splits([0, 0], [(0, 3)], num_cols=3)
    payload, count = pack(torch.empty(0, 3), empty, INT8, backend=triton_cpu)
    assert payload.numel() == 0 and int(count) == 0 and empty.split_bytes(INT8) == [0, 0]
    assert unpack_reduce(payload, empty, INT8, backend=triton_cpu).shape == (0, 3)
    uncovered = ExchangeLayout(
        ranks=(RankSlice(row_start=0, row_stop=0, blocks=((0, 3),)),), num_rows=4, num_cols=3
    )
    assert torch.equal(
        unpack_reduce(payload, uncovered, INT8, backend=triton_cpu), torch.zeros(4, 3)
    )


def test_uncovered_output_stays_zero(triton_cpu: str) -> None:
    send = ExchangeLayout(
        ranks=(RankSlice(row_start=0, row_stop=2, blocks=((1, 3),)),), num_rows=2, num_cols=6
    )
    recv = ExchangeLayout(
        ranks=(RankSlice(row_start=3, row_stop=5, blocks=((2, 3),)),), num_rows=6, num_cols=6
    )
    x = torch.arange(12.0).reshape(2, 6)
    payload, _ = pack(x, send, FP8_E4M3, backend=triton_cpu)
    out = unpack_reduce(payload, recv, FP8_E4M3, backend=triton_cpu)
    assert torch.equal(out, unpack_reduce(payload, recv, FP8_E4M3, backend="reference"))
    mask = torch.zeros(6, 6, dtype=torch.bool)
    mask[3:5, 2:5] = True
    assert torch.all(out[~mask] == 0) and torch.all(out[mask] != 0)


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_partial_overlap_is_rejected(backend: str, request: pytest.FixtureRequest) -> None:
    if backend == "triton":
        request.getfixturevalue("triton_cpu")
    recv = ExchangeLayout(
        ranks=(
            RankSlice(row_start=0, row_stop=4, blocks=((0, 4),)),
            RankSlice(row_start=2, row_stop=4, blocks=((0, 4),)),
        ),
        num_rows=4,
        num_cols=4,
    )
    payload = torch.zeros(recv.total_bytes(INT8), dtype=torch.uint8)
    with pytest.raises(ConfigError, match="overlap partially"):
        unpack_reduce(payload, recv, INT8, backend=backend)


def test_layout_validation_and_sizes() -> None:
    with pytest.raises(ConfigError, match="width >= 1"):
        ColumnBlock(start=0, width=0)
    with pytest.raises(ConfigError, match="start <= stop"):
        RankSlice(row_start=3, row_stop=2)
    with pytest.raises(ConfigError, match="exceed the layout's 4 rows"):
        ExchangeLayout(ranks=(RankSlice(row_start=0, row_stop=5),), num_rows=4, num_cols=2)
    with pytest.raises(ConfigError, match="exceeds the layout's 8 columns"):
        ExchangeLayout(
            ranks=(RankSlice(row_start=0, row_stop=1, blocks=((6, 3),)),), num_rows=1, num_cols=8
        )
    layout = ExchangeLayout.from_row_splits([2, 0, 3], [(0, 5), (5, 3)], num_cols=8)
    assert layout.segments == (0, 2, 0, 5, 0, 2, 5, 3, 2, 3, 0, 5, 2, 3, 5, 3)
    assert iter_segments(layout.segments)[1] == (0, 2, 5, 3)
    assert layout.split_bytes(CODECS["fp32"]) == [64, 0, 96]
    assert layout.split_bytes(FP8_E4M3) == [2 * (12 + 8), 0, 3 * (12 + 8)]
    assert layout.split_bytes(INT8) == [2 * (16 + 12), 0, 3 * (16 + 12)]
    assert layout.total_bytes(CODECS["bf16"]) == 5 * 16


def test_bad_inputs_raise_config_errors() -> None:
    layout = ExchangeLayout.from_row_splits([2, 2], [(0, 3)], num_cols=3)
    with pytest.raises(ConfigError, match="describes"):
        pack(torch.zeros(5, 3), layout, INT8, backend="reference")
    with pytest.raises(ConfigError, match="fp32/bf16/fp16"):
        pack(torch.zeros(4, 3, dtype=torch.int32), layout, INT8, backend="reference")
    with pytest.raises(ConfigError, match="payload must be 1-D uint8 of 48 bytes"):
        unpack_reduce(torch.zeros(31, dtype=torch.uint8), layout, INT8, backend="reference")
    with pytest.raises(ConfigError, match="unknown codec"):
        pack(torch.zeros(4, 3), layout, "fp4", backend="reference")


def test_unpack_accepts_an_unaligned_slice_of_the_receive_buffer(triton_cpu: str) -> None:
    layout = ExchangeLayout.from_row_splits([2, 1], [(0, 5)], num_cols=5)
    payload, _ = pack(random_rows(29, 3, 5, torch.float32), layout, INT8, backend="reference")
    received = torch.cat([torch.zeros(3, dtype=torch.uint8), payload])[3:]
    assert received.storage_offset() == 3
    assert torch.equal(
        unpack_reduce(received, layout, INT8, backend=triton_cpu),
        unpack_reduce(payload, layout, INT8, backend="reference"),
    )


@pytest.mark.parametrize("codec", [CODECS["fp16"], FP8_E4M3, INT8], ids=lambda c: c.name)
def test_a_peer_with_several_row_runs(codec: Codec, triton_cpu: str) -> None:
    """The UB requester's layout: each peer answers runs of different rows (one per table
    and row shard), each with its own column block; runs are laid out in order."""
    layout = ExchangeLayout(
        ranks=(
            (
                RankSlice(row_start=0, row_stop=3, blocks=((0, 5),)),
                RankSlice(row_start=7, row_stop=9, blocks=((2, 3),)),
            ),
            RankSlice(row_start=3, row_stop=7, blocks=((0, 5),)),
            (),  # a peer asked for nothing
        ),
        num_rows=9,
        num_cols=5,
    )
    assert layout.segments == (0, 3, 0, 5, 7, 2, 2, 3, 3, 4, 0, 5)
    assert layout.split_bytes(codec) == [
        3 * codec.row_bytes(5) + 2 * codec.row_bytes(3),
        4 * codec.row_bytes(5),
        0,
    ]
    x = torch.randn(9, 5, generator=torch.Generator().manual_seed(3))
    blocks = [(slice(0, 3), slice(0, 5)), (slice(7, 9), slice(2, 5)), (slice(3, 7), slice(0, 5))]
    encoded = [codec.encode(x[rows, cols]).payload for rows, cols in blocks]
    for backend in ("reference", triton_cpu):
        payload, _ = pack(x, layout, codec, backend=backend)
        assert torch.equal(payload, torch.cat([e.reshape(-1) for e in encoded])), backend
        out = unpack_reduce(payload, layout, codec, backend=backend)
        for (rows, cols), e in zip(blocks, encoded, strict=True):
            assert torch.equal(out[rows, cols], codec.decode(e, cols.stop - cols.start)), backend
        assert torch.equal(out[7:9, :2], torch.zeros(2, 2))  # no run covers these
    with pytest.raises(ConfigError, match="exceed the layout's 9 rows"):
        ExchangeLayout(
            ranks=((RankSlice(row_start=8, row_stop=10, blocks=((0, 1),)),),),
            num_rows=9,
            num_cols=5,
        )
