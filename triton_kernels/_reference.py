"""Pure-torch reference ops: the test oracle of the kernels and the CPU production path.

Each op walks the flattened segments (see :mod:`.exchange_layout`) and calls the engine's
codecs block by block, so the bytes are the codecs' bytes by construction. The
Triton kernels must produce the same bytes and (in the interpreter, where no FMA
contraction happens) the same fp32 sums, in the same order: partial results are
added in buffer order, starting from zero.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from lightning_embark.errors import ConfigError
from lightning_embark.kernels._exchange_layout import iter_segments, segment_offsets
from lightning_embark.wire import Codec, all_finite


def check_rows(x: Tensor, what: str) -> None:
    """Raise ConfigError unless ``x`` is a 2-D fp32 / bf16 / fp16 tensor."""
    if x.dim() != 2 or x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ConfigError(
            f"{what} must be a 2-D fp32/bf16/fp16 tensor, got {x.dtype} of shape {tuple(x.shape)}"
        )


def max_row(segments: Sequence[int]) -> int:
    """One past the last row (or index position) any segment touches."""
    return max((r0 + n for r0, n, _, _ in iter_segments(segments)), default=0)


def max_col(segments: Sequence[int]) -> int:
    return max((c0 + w for _, _, c0, w in iter_segments(segments)), default=0)


def check_shape(segments: Sequence[int], num_rows: int, num_cols: int, what: str) -> None:
    if max_row(segments) > num_rows or max_col(segments) > num_cols:
        raise ConfigError(
            f"layout needs {what} of at least [{max_row(segments)}, {max_col(segments)}], "
            f"got [{num_rows}, {num_cols}]"
        )


def check_payload(payload: Tensor, segments: Sequence[int], codec: Codec) -> list[int]:
    """Raise ConfigError unless ``payload`` is the 1-D uint8 buffer the layout describes."""
    offsets, total = segment_offsets(segments, codec)
    if payload.dtype != torch.uint8 or payload.dim() != 1 or payload.numel() != total:
        raise ConfigError(
            f"{codec.name} payload must be 1-D uint8 of {total} bytes for this layout, got "
            f"{payload.dtype} of shape {tuple(payload.shape)}"
        )
    return offsets


def pack_reference(x: Tensor, segments: Sequence[int], codec: Codec) -> tuple[Tensor, Tensor]:
    """Encode every segment of ``x`` into one buffer.

    Returns:
        The 1-D uint8 send buffer and the number of non-finite values encoded
        (0-d int64; a value sent to two ranks counts twice).
    """
    check_rows(x, "pack input")
    check_shape(segments, x.shape[0], x.shape[1], "the input")
    segs = iter_segments(segments)
    # One finiteness check for the whole input instead of one per segment (CPU: it syncs).
    finite = len(segs) > 1 and x.device.type == "cpu" and all_finite(x)
    parts: list[Tensor] = []
    found: Tensor | int = 0
    for r0, n, c0, w in segs:
        # A contiguous copy first: the codecs make several passes over the block.
        result = codec.encode(x[r0 : r0 + n, c0 : c0 + w].contiguous(), known_finite=finite)
        parts.append(result.payload.reshape(-1))
        found = found + result.num_nonfinite
    count = torch.as_tensor(found, dtype=torch.int64, device=x.device)
    if len(parts) == 1:  # a whole block: no copy
        return parts[0], count
    payload = torch.cat(parts) if parts else torch.empty(0, dtype=torch.uint8, device=x.device)
    return payload, count


def _decoded_segments(payload: Tensor, segments: Sequence[int], codec: Codec):
    offsets = check_payload(payload, segments, codec)
    for offset, (r0, n, c0, w) in zip(offsets, iter_segments(segments), strict=True):
        block = payload[offset : offset + n * codec.row_bytes(w)].view(n, codec.row_bytes(w))
        yield r0, n, c0, w, codec.decode(block, w)


def unpack_reduce_reference(
    payload: Tensor, segments: Sequence[int], codec: Codec, num_rows: int, num_cols: int
) -> Tensor:
    """Decode every segment into ``[num_rows, num_cols]`` fp32, summing coinciding ones.

    Positions no segment covers are zero.
    """
    check_shape(segments, num_rows, num_cols, "the output")
    if tuple(segments) == (0, num_rows, 0, num_cols) and num_rows:
        # One segment covering the output (a whole block): the decoded rows are the sum
        # (equal values; a decoded -0.0 stays -0.0 here where the kernel's 0 + x gives +0.0).
        values = next(_decoded_segments(payload, segments, codec))[4]
        aliased = values.untyped_storage().data_ptr() == payload.untyped_storage().data_ptr()
        return values.clone() if aliased else values  # custom ops must not return input views
    out = torch.zeros(num_rows, num_cols, dtype=torch.float32, device=payload.device)
    for r0, n, c0, w, values in _decoded_segments(payload, segments, codec):
        out[r0 : r0 + n, c0 : c0 + w] += values
    return out
