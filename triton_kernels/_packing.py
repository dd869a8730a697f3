"""Quantise-and-pack: dense rows to the send buffer in one pass.

One program encodes ``BLOCK_R`` wire rows of one segment: it reads the source
values once (twice for scaled formats wider than one tile: statistics, then codes),
and writes codes, padding and per-row fp32 words straight to their place in the
send buffer, so no intermediate permuted or quantised copy exists.
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from lightning_embark._host_work import host_only
from lightning_embark.kernels._exchange_layout import iter_segments, segment_offsets
from lightning_embark.kernels._jit_codecs import (
    FORMAT_IDS,
    chunk_stats,
    encode_chunk,
    load_values,
    row_bytes,
    row_params,
    store_chunk,
    tile_mask,
)
from lightning_embark.kernels._jit_codecs import align4 as align4_jit
from lightning_embark.kernels._reference import check_rows, check_shape
from lightning_embark.wire import Codec, align4

#: Widest tile in columns; wider segments loop over column chunks.
MAX_BLOCK_W = 512
#: Target elements per tile (rows x columns).
TILE_ELEMENTS = 4096


@triton.jit
def _pack_kernel(
    x_ptr, seg_ptr, tile_ptr, out8, out16, out32, count_ptr, stride_x,
    FMT: tl.constexpr, IN_BF16: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_W: tl.constexpr, ONE_CHUNK: tl.constexpr, SRC_ALIGN: tl.constexpr,
    FULL_W: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    seg = tl.load(tile_ptr + 2 * pid)
    first = tl.load(tile_ptr + 2 * pid + 1)
    row_start = tl.load(seg_ptr + 5 * seg)
    num_rows = tl.load(seg_ptr + 5 * seg + 1)
    col0 = tl.load(seg_ptr + 5 * seg + 2)
    width = tl.load(seg_ptr + 5 * seg + 3)
    offset = tl.load(seg_ptr + 5 * seg + 4)
    rows = first + tl.arange(0, BLOCK_R)
    rmask = rows < num_rows
    src = (row_start + rows) * stride_x + col0
    if SRC_ALIGN > 1:  # lets the compiler vectorise the loads of aligned layouts
        src = tl.multiple_of(src, SRC_ALIGN)
    dst = offset + rows * row_bytes(width, FMT)
    SCALED: tl.constexpr = FMT >= 3
    stored = align4_jit(width) if SCALED else width
    cols = tl.arange(0, BLOCK_W)
    if FMT == 5:
        a = tl.full([BLOCK_R], float("inf"), tl.float32)
    else:
        a = tl.zeros([BLOCK_R], tl.float32)
    b = tl.full([BLOCK_R], float("-inf"), tl.float32)
    bad = tl.zeros([BLOCK_R], tl.int32)
    if ONE_CHUNK:
        m = tile_mask(rmask, cols, width, BLOCK_R, BLOCK_W, FULL_W)
        x, bad, a, b = chunk_stats(load_values(x_ptr, src, cols, m, IN_BF16), m, a, b, FMT)
        p0, p1, p2, scale = row_params(a, b, FMT)
        values = encode_chunk(x, cols, width, p0, p1, p2, FMT)
        store_chunk(
            out8,
            out16,
            out32,
            dst,
            cols,
            tile_mask(rmask, cols, stored, BLOCK_R, BLOCK_W, FULL_W),
            values,
            FMT,
        )
    else:
        if SCALED:
            for c in range(0, width, BLOCK_W):
                m = rmask[:, None] & ((c + cols)[None, :] < width)
                x, nb, a, b = chunk_stats(
                    load_values(x_ptr, src + c, cols, m, IN_BF16), m, a, b, FMT
                )
                bad += nb
        p0, p1, p2, scale = row_params(a, b, FMT)
        for c in range(0, stored, BLOCK_W):
            m = rmask[:, None] & ((c + cols)[None, :] < width)
            x, nb, _, _ = chunk_stats(load_values(x_ptr, src + c, cols, m, IN_BF16), m, a, b, FMT)
            if not SCALED:
                bad += nb
            values = encode_chunk(x, c + cols, width, p0, p1, p2, FMT)
            store = rmask[:, None] & ((c + cols)[None, :] < stored)
            store_chunk(out8, out16, out32, dst, c + cols, store, values, FMT)
    if SCALED:
        words = (dst + stored) // 4
        tl.store(out32 + words, scale, mask=rmask)
        if FMT == 5:
            tl.store(out32 + words + 1, p0, mask=rmask)
    total = tl.sum(bad, axis=0)
    tl.atomic_add(count_ptr, total, mask=total > 0)


def block_shape(max_width: int, codec: Codec) -> tuple[int, int, bool]:
    """(BLOCK_R, BLOCK_W, ONE_CHUNK) for segments up to ``max_width`` columns."""
    span = align4(max_width) if codec.name in ("fp8_e4m3", "fp8_e5m2", "int8") else max_width
    block_w = min(triton.next_power_of_2(max(span, 1)), MAX_BLOCK_W)
    block_r = max(1, min(64, TILE_ELEMENTS // block_w))
    return block_r, block_w, span <= block_w


def to_device(table: Tensor, device: torch.device) -> Tensor:
    """A host-made index table on ``device``. To a GPU from pinned memory without blocking:
    a copy from pageable memory waits for the whole stream (``memcpy_and_sync``), and a
    layout that changes every step (a UB cluster's) would make one such wait per call. The
    copy is queued on the current stream, which is why the tables are cached per stream
    (:func:`stream_key`)."""
    if device.type != "cuda":
        return table.to(device)
    return table.pin_memory().to(device, non_blocking=True)


def stream_key(device: torch.device) -> int:
    """The current stream on ``device`` (0 off CUDA), a key of the cached index tables: a
    table copied without blocking is ready on the stream that copied it, and freed on
    eviction where it was made, so each stream (training thread, lane, input pipeline)
    gets its own copy."""
    return torch.cuda.current_stream(device).stream_id if device.type == "cuda" else 0


@functools.lru_cache(maxsize=128)
@host_only
def _tables(
    segments: tuple[int, ...], codec: Codec, block_r: int, device: torch.device, stream: int
) -> tuple[Tensor, Tensor, int]:
    """Segment table ``[S, 5]`` (row_start, rows, col0, width, byte offset) and tile table,
    on ``device``: computed on the host from the layout (host work), copied once per
    ``stream`` (:func:`stream_key`) and cached."""
    offsets, total = segment_offsets(segments, codec)
    segs = [[*s, o] for s, o in zip(iter_segments(segments), offsets, strict=True)]
    seg_table = torch.tensor(segs, dtype=torch.int64, device="cpu").reshape(-1, 5)
    tiles_per_seg = (seg_table[:, 1] + block_r - 1) // block_r
    seg_ids = torch.repeat_interleave(torch.arange(len(segs), device="cpu"), tiles_per_seg)
    starts = torch.cumsum(tiles_per_seg, 0) - tiles_per_seg
    first_row = (torch.arange(len(seg_ids), device="cpu") - starts[seg_ids]) * block_r
    tiles = torch.stack([seg_ids, first_row], dim=1).contiguous()
    return to_device(seg_table, device), to_device(tiles, device), total


def power_of_two_divisor(values: list[int], cap: int = 16) -> int:
    """Largest power of two (at most ``cap``) dividing every value: an alignment hint."""
    g = 0
    for v in values:
        g = math.gcd(g, v)
    return cap if g == 0 else min(cap, g & -g)


def buffer_views(buffer: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """uint8, int16 and fp32 views of a wire buffer (a view the format cannot need is the uint8
    one).

    A buffer sliced at an unaligned byte offset is copied first: dtype views need alignment.
    """
    if buffer.storage_offset() % 4:
        buffer = buffer.clone()
    n = buffer.numel()
    return (
        buffer,
        buffer.view(torch.int16) if n % 2 == 0 else buffer,
        buffer.view(torch.float32) if n % 4 == 0 else buffer,
    )


def pack_triton(x: Tensor, segments: tuple[int, ...], codec: Codec) -> tuple[Tensor, Tensor]:
    """Launch the pack kernel; same contract as :func:`~.reference.pack_reference`."""
    check_rows(x, "pack input")
    check_shape(segments, x.shape[0], x.shape[1], "the input")
    if x.stride(1) != 1:
        x = x.contiguous()
    max_width = max((w for *_, w in iter_segments(segments)), default=1)
    block_r, block_w, one_chunk = block_shape(max_width, codec)
    segs = iter_segments(segments)
    full = one_chunk and all(w == block_w for *_, w in segs)
    seg_table, tiles, total = _tables(
        tuple(segments), codec, block_r, x.device, stream_key(x.device)
    )
    payload = torch.empty(total, dtype=torch.uint8, device=x.device)
    count = torch.zeros(1, dtype=torch.int32, device=x.device)
    if tiles.shape[0]:
        out8, out16, out32 = buffer_views(payload)
        _pack_kernel[(tiles.shape[0],)](
            x.view(torch.int16) if x.dtype == torch.bfloat16 else x,
            seg_table,
            tiles,
            out8,
            out16,
            out32,
            count,
            x.stride(0),
            FMT=FORMAT_IDS[codec.name],
            IN_BF16=x.dtype == torch.bfloat16,
            BLOCK_R=block_r,
            BLOCK_W=block_w,
            ONE_CHUNK=one_chunk,
            enable_fp_fusion=False,
            FULL_W=full,
            SRC_ALIGN=power_of_two_divisor([x.stride(0), *(c0 for _, _, c0, _ in segs)]),
        )
    return payload, count[0].to(torch.int64)
