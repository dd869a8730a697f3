"""Pure-torch reference ops: the test oracle of the kernels and the CPU production path.

Each op encodes (decodes) the segments of the flattened layout (see
:mod:`.exchange_layout`) with the engine's codecs, so the bytes are the codecs' bytes
by construction. The Triton kernels must produce the same bytes and (in the
interpreter, where no FMA contraction happens) the same fp32 sums, in the same
order: partial results are added in buffer order, starting from zero.

Every codec works row by row (a cast per element, fp8 and int8 one scale per row), so
encoding the rows of several same-width segments stacked together gives each
segment's bytes exactly: the ops stack the segments of each width and call the codec
once per width, not once per segment (a layout has a few widths but one segment per
table, column shard and peer). What depends only on the layout (the segments grouped
by width, byte offsets, bounds) is computed once per layout and cached.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from lightning_embark._host_work import host_work
from lightning_embark.errors import ConfigError
from lightning_embark.kernels._exchange_layout import iter_segments, segment_offsets
from lightning_embark.wire import Codec, all_finite


def check_rows(x: Tensor, what: str) -> None:
    """Raise ConfigError unless ``x`` is a 2-D fp32 / bf16 / fp16 tensor."""
    if x.dim() != 2 or x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ConfigError(
            f"{what} must be a 2-D fp32/bf16/fp16 tensor, got {x.dtype} of shape {tuple(x.shape)}"
        )


@functools.lru_cache(maxsize=1024)
def _extent(segments: tuple[int, ...]) -> tuple[int, int]:
    """One past the last row and column any segment touches (cached per layout)."""
    segs = iter_segments(segments)
    return (
        max((r0 + n for r0, n, _, _ in segs), default=0),
        max((c0 + w for _, _, c0, w in segs), default=0),
    )


def max_row(segments: Sequence[int]) -> int:
    """One past the last row (or index position) any segment touches."""
    return _extent(tuple(segments))[0]


def max_col(segments: Sequence[int]) -> int:
    return _extent(tuple(segments))[1]


def check_shape(segments: Sequence[int], num_rows: int, num_cols: int, what: str) -> None:
    rows, cols = _extent(tuple(segments))
    if rows > num_rows or cols > num_cols:
        raise ConfigError(
            f"layout needs {what} of at least [{rows}, {cols}], got [{num_rows}, {num_cols}]"
        )


def check_payload(payload: Tensor, segments: Sequence[int], codec: Codec) -> list[int]:
    """Raise ConfigError unless ``payload`` is the 1-D uint8 buffer the layout describes."""
    offsets, total = _offsets(tuple(segments), codec)
    if payload.dtype != torch.uint8 or payload.dim() != 1 or payload.numel() != total:
        raise ConfigError(
            f"{codec.name} payload must be 1-D uint8 of {total} bytes for this layout, got "
            f"{payload.dtype} of shape {tuple(payload.shape)}"
        )
    return list(offsets)


#: Row indices of aligned layouts (:func:`aligned_rows`), by layout, shape and device; a
#: layout recurs every step (RB) or changes with the batch (UB), so the cache stays small.
_ALIGNED: dict[tuple[tuple[int, ...], int, int, torch.device], Tensor] = {}
_ALIGNED_LIMIT = 64


def aligned_rows(
    segments: tuple[int, ...], num_rows: int, num_cols: int, device: torch.device
) -> Tensor | None:
    """The layout's segments as one row index into a ``[num_rows, num_cols]`` tensor seen
    as ``[num_rows * num_cols / w, w]``, in buffer order, when every segment has the one
    width ``w`` and ``w`` divides ``num_cols`` and every segment's first column (None
    otherwise, or for an empty layout).

    Segment ``(r0, n, c0, w)`` is rows ``(r0 + i) * (num_cols / w) + c0 / w`` for ``i < n``.

    Raises:
        ConfigError: a segment reaches past ``[num_rows, num_cols]``.
    """
    if not segments:
        return None
    width = segments[3]
    widths, cols = segments[3::4], segments[2::4]
    if widths.count(width) != len(widths) or num_cols % width or any(c % width for c in cols):
        return None
    key = (segments, num_rows, num_cols, device)
    cached = _ALIGNED.get(key)
    if cached is not None:
        return cached
    starts, counts = segments[0::4], segments[1::4]
    last_row = max(map(int.__add__, starts, counts))
    if last_row > num_rows or max(cols) + width > num_cols:
        check_shape(segments, num_rows, num_cols, "the dense side")  # raises, naming sizes
    per_row = num_cols // width
    total = sum(counts)
    # Made on the host from the layout (whatever the default device: host work), then
    # copied to the device once.
    host = torch.device("cpu")
    with host_work():
        n = torch.tensor(counts, dtype=torch.int64, device=host)
        first = torch.tensor(starts, dtype=torch.int64, device=host) * per_row
        first += torch.tensor(cols, dtype=torch.int64, device=host) // width
        begin = torch.cumsum(n, 0) - n  # each segment's first position in the stacked rows
        index = (
            torch.repeat_interleave(first - begin * per_row, n, output_size=total)
            + torch.arange(total, dtype=torch.int64, device=host) * per_row
        ).to(device)
    if len(_ALIGNED) >= _ALIGNED_LIMIT:
        _ALIGNED.clear()
    _ALIGNED[key] = index
    return index


@functools.lru_cache(maxsize=1024)
def _offsets(segments: tuple[int, ...], codec: Codec) -> tuple[tuple[int, ...], int]:
    offsets, total = segment_offsets(segments, codec)
    return tuple(offsets), total


@dataclass(frozen=True)
class _Group:
    """The segments of one width, in buffer order, stacked into one block of rows.

    Attributes:
        width: The segments' width.
        segments: Their indices in the layout (buffer order).
        rows: Row slices ``(r0, r0 + n, c0, c0 + w)`` of the dense side, per segment.
        bytes: Byte slices ``(start, stop)`` of the buffer, per segment.
        starts: First row of each segment in the stacked block (and a final total).
        contiguous: The segments' bytes are one run of the buffer (no gather to decode).
    """

    width: int
    segments: tuple[int, ...]
    rows: tuple[tuple[int, int, int, int], ...]
    bytes: tuple[tuple[int, int], ...]
    starts: tuple[int, ...]
    contiguous: bool


@dataclass(frozen=True)
class _Plan:
    """A layout seen by the reference ops: segments per width, and buffer order.

    Attributes:
        groups: One :class:`_Group` per distinct width (order of first appearance).
        order: Per segment in buffer order: ``(group, first stacked row, rows, row_start,
            col_start, width)``.
        total: Bytes of the buffer.
    """

    groups: tuple[_Group, ...]
    order: tuple[tuple[int, int, int, int, int, int], ...]
    total: int


@functools.lru_cache(maxsize=1024)
def _plan(segments: tuple[int, ...], codec: Codec) -> _Plan:
    """Group a layout's segments by width (cached: layouts recur every step)."""
    offsets, total = _offsets(segments, codec)
    members: dict[int, list[int]] = {}
    segs = iter_segments(segments)
    for index, (_, _, _, w) in enumerate(segs):
        members.setdefault(w, []).append(index)
    groups, where = [], {}
    for g, (w, indices) in enumerate(members.items()):
        starts = [0]
        for i in indices:
            r0, n, c0, _ = segs[i]
            where[i] = (g, starts[-1], n, r0, c0, w)
            starts.append(starts[-1] + n)
        spans = tuple((offsets[i], offsets[i] + segs[i][1] * codec.row_bytes(w)) for i in indices)
        groups.append(
            _Group(
                width=w,
                segments=tuple(indices),
                rows=tuple(
                    (r0, r0 + n, c0, c0 + w) for r0, n, c0, _ in (segs[i] for i in indices)
                ),
                bytes=spans,
                starts=tuple(starts),
                contiguous=spans[-1][1] - spans[0][0] == starts[-1] * codec.row_bytes(w),
            )
        )
    order = tuple(where[i] for i in range(len(segs)))
    return _Plan(groups=tuple(groups), order=order, total=total)


def _stack(x: Tensor, group: _Group) -> Tensor:
    """The rows of a group's segments of ``x`` one after another (one copy)."""
    blocks = [x[r0:r1, c0:c1] for r0, r1, c0, c1 in group.rows]
    return blocks[0].contiguous() if len(blocks) == 1 else torch.cat(blocks)


def pack_reference(x: Tensor, segments: Sequence[int], codec: Codec) -> tuple[Tensor, Tensor]:
    """Encode every segment of ``x`` into one buffer.

    The segments of each width are stacked and encoded in one codec call (row-wise
    codecs: the same bytes as one call per segment), then laid out in buffer order.
    Where every segment has one width ``w`` that divides ``x``'s columns and every
    segment's start (the layouts of a cluster whose tables share a width), the stacking
    is one row gather from ``x`` seen as ``[rows * cols / w, w]`` (:func:`aligned_rows`).

    Returns:
        The 1-D uint8 send buffer and the number of non-finite values encoded
        (0-d int64; a value sent to two ranks counts twice).
    """
    check_rows(x, "pack input")
    segments = tuple(segments)
    rows = aligned_rows(segments, x.shape[0], x.shape[1], x.device)
    if rows is not None:
        width = segments[3]
        result = codec.encode(x.contiguous().view(-1, width).index_select(0, rows))
        return result.payload.reshape(-1), _as_count(result.num_nonfinite, x.device)
    check_shape(segments, x.shape[0], x.shape[1], "the input")
    plan = _plan(segments, codec)
    # One finiteness check for the whole input instead of one per width (CPU: it syncs).
    finite = len(plan.order) > 1 and x.device.type == "cpu" and all_finite(x)
    encoded: list[Tensor] = []
    found: Tensor | int = 0
    for group in plan.groups:
        result = codec.encode(_stack(x, group), known_finite=finite)
        encoded.append(result.payload)
        found = found + result.num_nonfinite
    count = _as_count(found, x.device)
    if not encoded:
        return torch.empty(0, dtype=torch.uint8, device=x.device), count
    if len(encoded) == 1:  # one width: the stacked rows are the buffer
        return encoded[0].reshape(-1), count
    parts = [encoded[g][start : start + n].reshape(-1) for g, start, n, _, _, _ in plan.order]
    return torch.cat(parts), count


def _as_count(found: Tensor | int, device: torch.device) -> Tensor:
    """The non-finite count as a 0-d int64 tensor on ``device``: a Python count is filled in
    there (``as_tensor`` of a Python number would copy it from the host, which on a GPU
    waits for the stream)."""
    if isinstance(found, Tensor):
        return found.to(torch.int64)
    return torch.full((), found, dtype=torch.int64, device=device)


def pack_columns_reference(
    parts: Sequence[Tensor], segments: Sequence[int], codec: Codec
) -> tuple[Tensor, Tensor]:
    """:func:`pack_reference` of ``torch.cat(parts, dim=1)``, read from the parts in place.

    The stacking copy reads every segment where it lies (each segment must lie inside one
    part), so the concatenation is never made; a segment straddling two parts falls back
    to it. Same bytes and count as :func:`pack_reference` of the concatenation.
    """
    for part in parts:
        check_rows(part, "pack input")
    rows = {p.shape[0] for p in parts}
    widths = tuple(p.shape[1] for p in parts)
    if len(rows) != 1:
        raise ConfigError(
            f"pack parts must have one row count, got shapes {[p.shape for p in parts]}"
        )
    segments = tuple(segments)
    check_shape(segments, rows.pop(), sum(widths), "the input")
    located = _columns(segments, widths)
    if located is None:
        return pack_reference(torch.cat(list(parts), dim=1), segments, codec)
    plan = _plan(segments, codec)
    encoded: list[Tensor] = []
    found: Tensor | int = 0
    device = parts[0].device
    for where in located:  # the width groups of ``plan``, in its order
        blocks = [parts[f][r0:r1, c0:c1] for f, r0, r1, c0, c1 in where]
        stacked = blocks[0].contiguous() if len(blocks) == 1 else torch.cat(blocks)
        # The codec proves its block finite (one check per width) or counts what is not.
        result = codec.encode(stacked)
        encoded.append(result.payload)
        found = found + result.num_nonfinite
    count = _as_count(found, device)
    if not encoded:
        return torch.empty(0, dtype=torch.uint8, device=device), count
    if len(encoded) == 1:
        return encoded[0].reshape(-1), count
    return torch.cat(
        [encoded[g][start : start + n].reshape(-1) for g, start, n, _, _, _ in plan.order]
    ), count


@functools.lru_cache(maxsize=1024)
def _columns(
    segments: tuple[int, ...], widths: tuple[int, ...]
) -> tuple[tuple[tuple[int, int, int, int, int], ...], ...] | None:
    """Per width group of the layout (see :func:`_plan`), each segment as ``(part, r0, r1,
    c0, c1)`` in its part's columns; None when a segment straddles two parts."""
    starts = [0]
    for w in widths:
        starts.append(starts[-1] + w)
    groups: dict[int, list[tuple[int, int, int, int, int]]] = {}
    for r0, n, c0, w in iter_segments(segments):
        part = next((i for i in range(len(widths)) if starts[i] <= c0 < starts[i + 1]), None)
        if part is None or c0 + w > starts[part + 1]:
            return None
        base = starts[part]
        groups.setdefault(w, []).append((part, r0, r0 + n, c0 - base, c0 - base + w))
    return tuple(tuple(g) for g in groups.values())


def _decoded_groups(payload: Tensor, segments: tuple[int, ...], codec: Codec) -> list[Tensor]:
    """Every group's segments decoded, stacked as in :func:`_stack` (one decode per width)."""
    check_payload(payload, segments, codec)
    plan = _plan(segments, codec)
    out = []
    for group in plan.groups:
        rb = codec.row_bytes(group.width)
        if group.contiguous:
            block = payload[group.bytes[0][0] : group.bytes[-1][1]]
        else:
            block = torch.cat([payload[a:b] for a, b in group.bytes])
        out.append(codec.decode(block.view(group.starts[-1], rb), group.width))
    return out


def unpack_reduce_reference(
    payload: Tensor, segments: Sequence[int], codec: Codec, num_rows: int, num_cols: int
) -> Tensor:
    """Decode every segment into ``[num_rows, num_cols]`` fp32, summing coinciding ones.

    Positions no segment covers are zero; partials are added in buffer order to zeros.
    """
    segments = tuple(segments)
    rows = aligned_rows(segments, num_rows, num_cols, payload.device)
    if rows is not None and segments != (0, num_rows, 0, num_cols):
        # One width dividing every start: decode once, add every row into place in buffer
        # order (``index_add_`` runs its index in order: the same sums as the loop below).
        width = segments[3]
        expected = rows.numel() * codec.row_bytes(width)
        if payload.dtype != torch.uint8 or payload.dim() != 1 or payload.numel() != expected:
            check_payload(payload, segments, codec)  # raises, naming the sizes
        values = codec.decode(payload.view(rows.numel(), codec.row_bytes(width)), width)
        out = torch.zeros(num_rows, num_cols, dtype=torch.float32, device=payload.device)
        out.view(-1, width).index_add_(0, rows, values)
        return out
    check_shape(segments, num_rows, num_cols, "the output")
    if segments == (0, num_rows, 0, num_cols) and num_rows:
        # One segment covering the output (a whole block): the decoded rows are the sum
        # (equal values; a decoded -0.0 stays -0.0 here where the kernel's 0 + x gives +0.0).
        values = _decoded_groups(payload, segments, codec)[0]
        aliased = values.untyped_storage().data_ptr() == payload.untyped_storage().data_ptr()
        return values.clone() if aliased else values  # custom ops must not return input views
    decoded = _decoded_groups(payload, segments, codec)
    plan = _plan(segments, codec)
    out = torch.zeros(num_rows, num_cols, dtype=torch.float32, device=payload.device)
    for g, start, n, r0, c0, w in plan.order:
        out[r0 : r0 + n, c0 : c0 + w].add_(decoded[g][start : start + n])
    return out
