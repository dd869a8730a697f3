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

import functools
import os
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from lightning_embark.errors import ConfigError
from lightning_embark.kernels._exchange_layout import (
    ColumnBlock,
    ExchangeLayout,
    RankSlice,
    reduction_groups,
    segment_offsets,
)
from lightning_embark.kernels._packing import _pack_kernel, pack_triton
from lightning_embark.kernels._reference import (
    pack_columns_reference,
    pack_reference,
    unpack_reduce_reference,
)
from lightning_embark.kernels._unpacking import unpack_reduce_triton
from lightning_embark.wire import Codec, codec_by_name

BACKEND_ENV = "EMBARK_KERNEL_BACKEND"
BACKENDS = ("auto", "triton", "reference")


def interpreted() -> bool:
    """True when the kernels, and triton's own jit'd library (``tl.max``...), run in the
    interpreter: both must have been decorated with ``TRITON_INTERPRET=1`` set."""
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(_pack_kernel, InterpretedFunction) and isinstance(
        tl.max, InterpretedFunction
    )


def resolve_backend(device: torch.device, backend: str = "auto") -> str:
    """``"triton"`` or ``"reference"`` for tensors on ``device`` (see module docstring)."""
    if backend == "auto":
        backend = os.environ.get(BACKEND_ENV, "auto") or "auto"
    if backend not in BACKENDS:
        raise ConfigError(
            f"kernel backend {backend!r} unknown; use one of {BACKENDS} (argument or "
            f"${BACKEND_ENV})"
        )
    if backend == "auto":
        return "triton" if device.type == "cuda" else "reference"
    if backend == "triton" and device.type != "cuda" and not interpreted():
        raise ConfigError(
            f"Triton kernels on {device.type} tensors need the interpreter: set "
            "TRITON_INTERPRET=1 before triton is first imported, or use backend='reference'"
        )
    return backend


def _pack(x: Tensor, segments: list[int], codec: str, backend: str) -> tuple[Tensor, Tensor]:
    """Quantise ``x`` into the send buffer."""
    impl = pack_triton if resolve_backend(x.device, backend) == "triton" else pack_reference
    return impl(x, tuple(segments), codec_by_name(codec))


# The non-decorator form keeps the plain function callable (see _op) without a second signature.
pack_op = torch.library.custom_op("embark::pack", _pack, mutates_args=())


@pack_op.register_fake
def _pack_fake(x: Tensor, segments: list[int], codec: str, backend: str) -> tuple[Tensor, Tensor]:
    _, total = segment_offsets(segments, codec_by_name(codec))
    return x.new_empty(total, dtype=torch.uint8), x.new_empty((), dtype=torch.int64)


def _unpack_reduce(
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


unpack_reduce_op = torch.library.custom_op(
    "embark::unpack_reduce", _unpack_reduce, mutates_args=()
)


@unpack_reduce_op.register_fake
def _unpack_reduce_fake(
    payload: Tensor, segments: list[int], codec: str, num_rows: int, num_cols: int, backend: str
) -> Tensor:
    return payload.new_empty((num_rows, num_cols), dtype=torch.float32)


def _op(registered: Any, impl: Callable[..., Any]) -> Callable[..., Any]:
    """The registered op while ``torch.compile`` traces, else its implementation.

    The custom op's dispatch (autograd wrapper, dynamo guard) costs ~0.1 ms per call
    on the CPU, as much as encoding a small block; eager calls skip it (same results:
    the ops register no autograd of their own).
    """
    return registered if torch.compiler.is_compiling() else impl


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
    return _op(torch.ops.embark.pack, _pack)(x, list(layout.segments), _codec(codec).name, backend)


def pack_columns(
    parts: Sequence[Tensor], layout: ExchangeLayout, codec: Codec | str, *, backend: str = "auto"
) -> tuple[Tensor, Tensor]:
    """:func:`pack` of ``torch.cat(parts, dim=1)`` (e.g. every feature's ``[B, d]`` gradient).

    The reference backend reads each segment from its part, so the ``[rows, sum(d)]``
    concatenation is never made (one copy of the whole input less); the Triton kernel
    takes one dense input, so the other backends (and tracing) concatenate first.
    """
    if (
        parts
        and resolve_backend(parts[0].device, backend) == "reference"
        and not torch.compiler.is_compiling()
    ):
        if sum(p.shape[1] for p in parts) != layout.num_cols or any(
            p.dim() != 2 or p.shape[0] != layout.num_rows for p in parts
        ):
            raise ConfigError(
                f"pack parts of shapes {[tuple(p.shape) for p in parts]} do not make the "
                f"layout's ({layout.num_rows}, {layout.num_cols}); build the layout for them"
            )
        return pack_columns_reference(parts, layout.segments, _codec(codec))
    return pack(torch.cat(list(parts), dim=1), layout, codec, backend=backend)


def unpack_reduce(
    payload: Tensor, layout: ExchangeLayout, codec: Codec | str, *, backend: str = "auto"
) -> Tensor:
    """Unpack-dequantise-reduce the received buffer to fp32 ``[layout.num_rows,
    layout.num_cols]``."""
    return _op(torch.ops.embark.unpack_reduce, _unpack_reduce)(
        payload,
        list(layout.segments),
        _codec(codec).name,
        layout.num_rows,
        layout.num_cols,
        backend,
    )


def encode_rows(
    x: Tensor, codec: Codec | str, *, backend: str = "auto"
) -> tuple[Tensor, Tensor | int]:
    """Encode a whole block ``x[rows, width]`` to ``uint8 [rows, row_bytes(width)]``.

    The engine's codec entry point: the same bytes as ``codec.encode(x)`` (which is
    what the reference backend runs), while CUDA tensors take the Triton pack kernel.

    Returns:
        The encoded rows and the non-finite count (0-d int64, or a plain 0 when the
        reference proved the block finite).
    """
    codec = _codec(codec)
    rows, width = _block_shape(x, codec)
    if resolve_backend(x.device, backend) == "reference" and not torch.compiler.is_compiling():
        result = codec.encode(x)  # what pack_reference does for a whole block, minus the layout
        return result.payload, result.num_nonfinite
    payload, count = pack(x, _whole(rows, width), codec, backend=backend)
    return payload.view(rows, codec.row_bytes(width)), count


def decode_rows(
    payload: Tensor, codec: Codec | str, width: int, *, backend: str = "auto"
) -> Tensor:
    """Decode ``uint8 [rows, row_bytes(width)]`` (any byte offset) to fp32 ``[rows, width]``."""
    codec = _codec(codec)
    expected = codec.row_bytes(width) if width >= 1 else -1
    if payload.dtype != torch.uint8 or payload.dim() != 2 or payload.shape[1] != expected:
        raise ConfigError(
            f"{codec.name} rows must be uint8 [rows, {expected}] for width {width}, got "
            f"{payload.dtype} of shape {tuple(payload.shape)}; pass the bytes encode_rows produced"
        )
    if (
        resolve_backend(payload.device, backend) == "reference"
        and not torch.compiler.is_compiling()
    ):
        return codec.decode(payload, width)
    return unpack_reduce(
        payload.reshape(-1), _whole(payload.shape[0], width), codec, backend=backend
    )


def _block_shape(x: Tensor, codec: Codec) -> tuple[int, int]:
    if x.dim() != 2 or x.shape[1] < 1:
        raise ConfigError(
            f"{codec.name} rows: expected a 2-D [rows, width >= 1] tensor, got shape "
            f"{tuple(x.shape)}"
        )
    return x.shape[0], x.shape[1]


@functools.lru_cache(maxsize=1024)
def _whole(rows: int, width: int) -> ExchangeLayout:
    """One rank, one block: the layout of a block encoded as a whole."""
    return ExchangeLayout(
        ranks=(
            RankSlice(row_start=0, row_stop=rows, blocks=(ColumnBlock(start=0, width=width),)),
        ),
        num_rows=rows,
        num_cols=width,
    )
