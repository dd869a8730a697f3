"""Unique-row paths (UB): gather-and-pack forward, unpack-and-accumulate backward.

Forward, an owner gathers the unique rows each requester asked for and quantises
them into the send buffer: that is the pack kernel with an index indirection
(:func:`gather_pack_triton`). Backward, the owner receives one gradient per unique
row per requester and accumulates them per table row (``index_add`` semantics).
Rows asked for by several requesters get several contributions; they are sorted by
(column block, target row) with a stable sort, so one program sums each row's
contributions in buffer order without atomics, matching the reference bit for bit.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from lightning_embark.engine.codecs import Codec
from lightning_embark.kernels.layout import column_blocks, iter_segments, segment_offsets
from lightning_embark.kernels.packing import MAX_BLOCK_W, buffer_views, pack_triton
from lightning_embark.kernels.reference import check_indices, check_payload, check_shape, max_row
from lightning_embark.kernels.wire import FORMAT_IDS, decode_chunk

#: Output rows (distinct target row and column block) per program.
BLOCK_ROWS = 16


@triton.jit
def _index_add_kernel(
    in8, in16, in32, out_ptr, group_ptr, contrib_ptr, num_groups, stride_out,
    FMT: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_W: tl.constexpr,
):  # fmt: skip
    g = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    gmask = g < num_groups
    target = tl.load(group_ptr + 5 * g, mask=gmask, other=0)
    col0 = tl.load(group_ptr + 5 * g + 1, mask=gmask, other=0)
    width = tl.load(group_ptr + 5 * g + 2, mask=gmask, other=0)
    begin = tl.load(group_ptr + 5 * g + 3, mask=gmask, other=0)
    count = tl.load(group_ptr + 5 * g + 4, mask=gmask, other=0) - begin
    most = tl.max(count, axis=0)
    cols = tl.arange(0, BLOCK_W)
    out_rows = out_ptr + target * stride_out + col0
    for c in range(0, tl.max(width, axis=0), BLOCK_W):
        m = gmask[:, None] & ((c + cols)[None, :] < width[:, None])
        acc = tl.zeros([BLOCK_R, BLOCK_W], tl.float32)
        for k in range(0, most):
            live = gmask & (k < count)
            src = tl.load(contrib_ptr + begin + k, mask=live, other=0)
            value = decode_chunk(in8, in16, in32, src, c + cols, m & live[:, None], live, width, FMT)
            acc += tl.where(live[:, None], value, 0.0)
        tl.store(out_rows[:, None] + (c + cols)[None, :], acc, mask=m)


def gather_pack_triton(
    rows: Tensor, indices: Tensor, segments: tuple[int, ...], codec: Codec
) -> tuple[Tensor, Tensor]:
    """Pack ``rows[indices[r0 : r0 + n], c0 : c0 + w]`` for every segment (one kernel)."""
    return pack_triton(rows, indices, segments, codec)


def _groups(indices: Tensor, segments: tuple[int, ...], codec: Codec, num_rows: int) -> tuple[Tensor, Tensor]:
    """Group table ``[G, 5]`` (target row, col0, width, first, end) and contribution offsets."""
    segs = iter_segments(segments)
    blocks = column_blocks(segments)
    block_id = {b: i for i, b in enumerate(blocks)}
    offsets, _ = segment_offsets(segments, codec)
    device = indices.device
    per_seg = (
        torch.tensor(
            [
                [r0, n, block_id[(c0, w)], off, codec.row_bytes(w)]
                for (r0, n, c0, w), off in zip(segs, offsets, strict=True)
            ],
            dtype=torch.int64,
        )
        .reshape(-1, 5)
        .to(device)
    )
    seg_of = torch.repeat_interleave(torch.arange(len(segs), device=device), per_seg[:, 1])
    within = (
        torch.arange(seg_of.numel(), device=device) - (torch.cumsum(per_seg[:, 1], 0) - per_seg[:, 1])[seg_of]
    )
    target = indices.long()[per_seg[seg_of, 0] + within]
    key = per_seg[seg_of, 2] * num_rows + target
    order = torch.argsort(key, stable=True)
    keys, counts = torch.unique_consecutive(key[order], return_counts=True)
    end = torch.cumsum(counts, 0)
    block_table = torch.tensor(blocks, dtype=torch.int64).reshape(-1, 2).to(device)
    group_table = torch.stack(
        [
            keys % num_rows,
            block_table[keys // num_rows, 0],
            block_table[keys // num_rows, 1],
            end - counts,
            end,
        ],
        dim=1,
    )
    contrib = (per_seg[seg_of, 3] + within * per_seg[seg_of, 4])[order]
    return group_table.contiguous(), contrib.contiguous()


def unpack_index_add_triton(
    payload: Tensor, indices: Tensor, segments: tuple[int, ...], codec: Codec, num_rows: int, num_cols: int
) -> Tensor:
    """Launch the accumulate kernel; same contract as
    :func:`~.reference.unpack_index_add_reference`."""
    check_payload(payload, segments, codec)
    check_indices(indices, max_row(segments), num_rows)
    check_shape(segments, indices.numel(), num_cols, "the index list")
    out = torch.zeros(num_rows, num_cols, dtype=torch.float32, device=payload.device)
    if not segments or num_rows == 0:
        return out
    group_table, contrib = _groups(indices, tuple(segments), codec, num_rows)
    max_width = max(w for *_, w in iter_segments(segments))
    block_w = min(triton.next_power_of_2(max_width), MAX_BLOCK_W)
    in8, in16, in32 = buffer_views(payload)
    grid = (triton.cdiv(group_table.shape[0], BLOCK_ROWS),)
    _index_add_kernel[grid](
        in8, in16, in32, out, group_table, contrib, group_table.shape[0], out.stride(0),
        FMT=FORMAT_IDS[codec.name], BLOCK_R=BLOCK_ROWS, BLOCK_W=block_w, enable_fp_fusion=False,
    )  # fmt: skip
    return out
