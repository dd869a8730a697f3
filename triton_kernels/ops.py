"""``torch.library`` custom ops (``embark::``) with fake kernels, and their dispatch.

The ops take the layout flattened to integer lists (:attr:`ExchangeLayout.segments`)
and the codec by name, so ``torch.compile`` traces them as opaque nodes whose
output shapes the fake kernels compute from those integers alone.

Dispatch: ``backend="auto"`` runs the Triton kernels on CUDA tensors and the
pure-torch reference on CPU. The environment variable ``EMBARK_KERNEL_BACKEND``
(``triton`` or ``reference``) overrides ``auto``; ``triton`` on CPU tensors runs the
kernels in Triton's interpreter, which needs ``TRITON_INTERPRET=1`` set before
``triton`` is first imported (torchrec and fbgemm import it, so set it first thing);
that is how the tests check the kernels without a GPU.
"""

from __future__ import annotations

import os

import torch
from torch import Tensor

from lightning_embark.engine.codecs import Codec, codec_by_name
from lightning_embark.errors import ConfigError
from lightning_embark.kernels.layout import ExchangeLayout, column_blocks, reduction_groups, segment_offsets
from lightning_embark.kernels.packing import _pack_kernel, pack_triton
from lightning_embark.kernels.reference import (
    pack_reference,
    unpack_index_add_reference,
    unpack_reduce_reference,
)
from lightning_embark.kernels.unique import unpack_index_add_triton
from lightning_embark.kernels.unpacking import unpack_reduce_triton

BACKEND_ENV = "EMBARK_KERNEL_BACKEND"
BACKENDS = ("auto", "triton", "reference")


def interpreted() -> bool:
    """True when the kernels, and triton's own jit'd library (``tl.max``...), run in the
    interpreter: both must have been decorated with ``TRITON_INTERPRET=1`` set."""
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(_pack_kernel, InterpretedFunction) and isinstance(tl.max, InterpretedFunction)


def resolve_backend(device: torch.device, backend: str = "auto") -> str:
    """``"triton"`` or ``"reference"`` for tensors on ``device`` (see module docstring)."""
    if backend == "auto":
        backend = os.environ.get(BACKEND_ENV, "auto") or "auto"
    if backend not in BACKENDS:
        raise ConfigError(
            f"kernel backend {backend!r} unknown; use one of {BACKENDS} (argument or ${BACKEND_ENV})"
        )
    if backend == "auto":
        return "triton" if device.type == "cuda" else "reference"
    if backend == "triton" and device.type != "cuda" and not interpreted():
        raise ConfigError(
            f"Triton kernels on {device.type} tensors need the interpreter: set TRITON_INTERPRET=1 "
            "before triton is first imported, or use backend='reference'"
        )
    return backend


@torch.library.custom_op("embark::pack", mutates_args=())
def pack_op(
    x: Tensor, indices: Tensor | None, segments: list[int], codec: str, backend: str
) -> tuple[Tensor, Tensor]:
    """Quantise ``x`` (rows ``indices[...]`` when given) into the send buffer."""
    impl = pack_triton if resolve_backend(x.device, backend) == "triton" else pack_reference
    return impl(x, indices, tuple(segments), codec_by_name(codec))


@pack_op.register_fake
def _pack_fake(
    x: Tensor, indices: Tensor | None, segments: list[int], codec: str, backend: str
) -> tuple[Tensor, Tensor]:
    _, total = segment_offsets(segments, codec_by_name(codec))
    return x.new_empty(total, dtype=torch.uint8), x.new_empty((), dtype=torch.int64)


@torch.library.custom_op("embark::unpack_reduce", mutates_args=())
def unpack_reduce_op(
    payload: Tensor, segments: list[int], codec: str, num_rows: int, num_cols: int, backend: str
) -> Tensor:
    """Decode the received buffer into ``[num_rows, num_cols]``, summing coinciding blocks."""
    segments_t = tuple(segments)
    reduction_groups(segments_t)  # rejects partial overlaps on every path
    impl = (
        unpack_reduce_triton
        if resolve_backend(payload.device, backend) == "triton"
        else unpack_reduce_reference
    )
    return impl(payload, segments_t, codec_by_name(codec), num_rows, num_cols)


@unpack_reduce_op.register_fake
def _unpack_reduce_fake(
    payload: Tensor, segments: list[int], codec: str, num_rows: int, num_cols: int, backend: str
) -> Tensor:
    return payload.new_empty((num_rows, num_cols), dtype=torch.float32)


@torch.library.custom_op("embark::unpack_index_add", mutates_args=())
def unpack_index_add_op(
    payload: Tensor,
    indices: Tensor,
    segments: list[int],
    codec: str,
    num_rows: int,
    num_cols: int,
    backend: str,
) -> Tensor:
    """Decode unique-row segments and accumulate them into rows ``indices[...]``."""
    column_blocks(tuple(segments))  # rejects overlapping column blocks on every path
    use_triton = resolve_backend(payload.device, backend) == "triton"
    impl = unpack_index_add_triton if use_triton else unpack_index_add_reference
    return impl(payload, indices, tuple(segments), codec_by_name(codec), num_rows, num_cols)


@unpack_index_add_op.register_fake
def _unpack_index_add_fake(
    payload: Tensor,
    indices: Tensor,
    segments: list[int],
    codec: str,
    num_rows: int,
    num_cols: int,
    backend: str,
) -> Tensor:
    return payload.new_empty((num_rows, num_cols), dtype=torch.float32)


def _codec(codec: Codec | str) -> Codec:
    return codec if isinstance(codec, Codec) else codec_by_name(codec)


def _check_dense(x: Tensor, layout: ExchangeLayout, what: str, rows: int | None = None) -> None:
    expected = (layout.num_rows if rows is None else rows, layout.num_cols)
    if x.dim() != 2 or tuple(x.shape) != expected:
        raise ConfigError(
            f"{what} has shape {tuple(x.shape)} but the layout describes {expected}; "
            "build the layout for this tensor"
        )


def pack(
    x: Tensor, layout: ExchangeLayout, codec: Codec | str, *, backend: str = "auto"
) -> tuple[Tensor, Tensor]:
    """Quantise-and-pack ``x[layout.num_rows, layout.num_cols]`` (fp32/bf16/fp16).

    Returns:
        The 1-D uint8 send buffer (ranks contiguous, split sizes
        ``layout.split_bytes(codec)``) and the non-finite count (0-d int64).
    """
    _check_dense(x, layout, "pack input")
    return torch.ops.embark.pack(x, None, list(layout.segments), _codec(codec).name, backend)


def gather_pack(
    rows: Tensor, indices: Tensor, layout: ExchangeLayout, codec: Codec | str, *, backend: str = "auto"
) -> tuple[Tensor, Tensor]:
    """Gather ``rows[indices]`` per segment and pack them (UB forward, at the owner).

    ``layout`` rows are positions in ``indices`` (``layout.num_rows == len(indices)``),
    its columns those of ``rows``. Indices must lie in ``[0, rows.shape[0])``; on CPU
    they are checked, on CUDA that would cost a host sync, so they are not.
    """
    _check_dense(rows, layout, "gathered rows", rows=rows.shape[0])
    if indices.dim() != 1 or indices.numel() != layout.num_rows:
        raise ConfigError(
            f"indices must be 1-D of length {layout.num_rows} (layout rows), got {tuple(indices.shape)}"
        )
    return torch.ops.embark.pack(rows, indices, list(layout.segments), _codec(codec).name, backend)


def unpack_reduce(
    payload: Tensor, layout: ExchangeLayout, codec: Codec | str, *, backend: str = "auto"
) -> Tensor:
    """Unpack-dequantise-reduce the received buffer to fp32 ``[layout.num_rows, layout.num_cols]``."""
    return torch.ops.embark.unpack_reduce(
        payload, list(layout.segments), _codec(codec).name, layout.num_rows, layout.num_cols, backend
    )


def unpack_index_add(
    payload: Tensor,
    indices: Tensor,
    layout: ExchangeLayout,
    codec: Codec | str,
    *,
    num_rows: int,
    backend: str = "auto",
) -> Tensor:
    """Decode unique-row gradients and ``index_add`` them into fp32 ``[num_rows, layout.num_cols]``.

    ``layout`` is the forward :func:`gather_pack` layout (rows are positions in
    ``indices``); contributions to one row are summed in buffer order.
    """
    if indices.dim() != 1 or indices.numel() != layout.num_rows:
        raise ConfigError(
            f"indices must be 1-D of length {layout.num_rows} (layout rows), got {tuple(indices.shape)}"
        )
    return torch.ops.embark.unpack_index_add(
        payload, indices, list(layout.segments), _codec(codec).name, num_rows, layout.num_cols, backend
    )
