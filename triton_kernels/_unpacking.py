"""Unpack-dequantise-reduce: the received buffer to the dense output in one pass.

Segments covering the same output block (partial sums of row shards from several
owners) are grouped ahead of time; one program owns ``BLOCK_R`` rows of one output
block and adds the decoded contributions in buffer order in registers before a
single store. No atomics, so the result is deterministic and equals the
reference's ``out[block] += decode(segment)`` sequence.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from torch import Tensor

from lightning_embark._host_work import host_only
from lightning_embark.kernels._exchange_layout import (
    iter_segments,
    reduction_groups,
    segment_offsets,
)
from lightning_embark.kernels._jit_codecs import FORMAT_IDS, decode_chunk, row_bytes, tile_mask
from lightning_embark.kernels._packing import (
    MAX_BLOCK_W,
    TILE_ELEMENTS,
    buffer_views,
    power_of_two_divisor,
    stream_key,
    to_device,
)
from lightning_embark.kernels._reference import check_payload, check_shape
from lightning_embark.wire import Codec


@triton.jit
def _unpack_kernel(
    in8, in16, in32, out_ptr, group_ptr, contrib_ptr, tile_ptr, stride_out,
    FMT: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_W: tl.constexpr, OUT_ALIGN: tl.constexpr,
    FULL_W: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    group = tl.load(tile_ptr + 2 * pid)
    first = tl.load(tile_ptr + 2 * pid + 1)
    row_start = tl.load(group_ptr + 6 * group)
    num_rows = tl.load(group_ptr + 6 * group + 1)
    col0 = tl.load(group_ptr + 6 * group + 2)
    width = tl.load(group_ptr + 6 * group + 3)
    begin = tl.load(group_ptr + 6 * group + 4)
    end = tl.load(group_ptr + 6 * group + 5)
    rows = first + tl.arange(0, BLOCK_R)
    rmask = rows < num_rows
    rel = rows * row_bytes(width, FMT)
    out_offsets = (row_start + rows) * stride_out + col0
    if OUT_ALIGN > 1:  # lets the compiler vectorise the stores of aligned layouts
        out_offsets = tl.multiple_of(out_offsets, OUT_ALIGN)
    out_rows = out_ptr + out_offsets
    cols = tl.arange(0, BLOCK_W)
    for c in range(0, width, BLOCK_W):
        m = tile_mask(rmask, c + cols, width, BLOCK_R, BLOCK_W, FULL_W)
        acc = tl.zeros([BLOCK_R, BLOCK_W], tl.float32)
        for k in range(begin, end):
            src = tl.load(contrib_ptr + k) + rel
            acc += decode_chunk(in8, in16, in32, src, c + cols, m, rmask, width, FMT)
        tl.store(out_rows[:, None] + (c + cols)[None, :], acc, mask=m)


@functools.lru_cache(maxsize=128)
@host_only
def _tables(
    segments: tuple[int, ...], codec: Codec, block_r: int, device: torch.device, stream: int
):
    """Group table ``[G, 6]`` (row_start, rows, col0, width, first, end contribution),
    contribution byte offsets, tile table (on ``device``: computed on the host from the
    layout, host work, copied without blocking and cached per ``stream``: see
    :func:`~._packing.stream_key`), and how many output elements the groups cover."""
    offsets, _ = segment_offsets(segments, codec)
    groups: list[list[int]] = []
    contrib: list[int] = []
    for (r0, n, c0, w), members in reduction_groups(segments):
        groups.append([r0, n, c0, w, len(contrib), len(contrib) + len(members)])
        contrib += [offsets[i] for i in members]
    group_table = torch.tensor(groups, dtype=torch.int64, device="cpu").reshape(-1, 6)
    tiles_per_group = (group_table[:, 1] + block_r - 1) // block_r
    group_ids = torch.repeat_interleave(torch.arange(len(groups), device="cpu"), tiles_per_group)
    starts = torch.cumsum(tiles_per_group, 0) - tiles_per_group
    first_row = (torch.arange(len(group_ids), device="cpu") - starts[group_ids]) * block_r
    tiles = torch.stack([group_ids, first_row], dim=1).contiguous()
    covered = int((group_table[:, 1] * group_table[:, 3]).sum()) if groups else 0
    return (
        to_device(group_table, device),
        to_device(torch.tensor(contrib, dtype=torch.int64, device="cpu"), device),
        to_device(tiles, device),
        covered,
    )


def unpack_reduce_triton(
    payload: Tensor, segments: tuple[int, ...], codec: Codec, num_rows: int, num_cols: int
) -> Tensor:
    """Launch the unpack kernel; same contract as :func:`~.reference.unpack_reduce_reference`."""
    check_payload(payload, segments, codec)
    check_shape(segments, num_rows, num_cols, "the output")
    max_width = max((w for *_, w in iter_segments(segments)), default=1)
    block_w = min(triton.next_power_of_2(max_width), MAX_BLOCK_W)
    block_r = max(1, min(64, TILE_ELEMENTS // block_w))
    group_table, contrib, tiles, covered = _tables(
        tuple(segments), codec, block_r, payload.device, stream_key(payload.device)
    )
    # Groups are disjoint, so covering every element means no zero fill is needed.
    alloc = torch.empty if covered == num_rows * num_cols else torch.zeros
    out = alloc(num_rows, num_cols, dtype=torch.float32, device=payload.device)
    if tiles.shape[0]:
        in8, in16, in32 = buffer_views(payload)
        segs = iter_segments(segments)
        _unpack_kernel[(tiles.shape[0],)](
            in8,
            in16,
            in32,
            out,
            group_table,
            contrib,
            tiles,
            out.stride(0),
            FMT=FORMAT_IDS[codec.name],
            BLOCK_R=block_r,
            BLOCK_W=block_w,
            enable_fp_fusion=False,
            OUT_ALIGN=power_of_two_divisor([out.stride(0), *(c0 for _, _, c0, _ in segs)]),
            FULL_W=all(w == block_w for *_, w in segs),
        )
    return out
