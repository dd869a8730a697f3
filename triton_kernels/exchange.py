"""Differentiable compressed exchanges: pack -> transport -> unpack, and the mirror back.

The wire buffer is ``uint8``, so autograd cannot flow through the custom ops one by
one. Instead the whole exchange is one autograd function: pack and unpack-reduce
are adjoint (pack copies blocks out, unpack sums blocks in), so the backward of an
exchange is the same exchange reversed with the backward codec:

* :func:`exchange` (RB): ``y = unpack_reduce(T(pack(x, send)), recv)``; backward
  ``grad_x = unpack_reduce(T'(pack(grad_y, recv)), send)``: the gradient of a sum
  of row-shard partials is sent back to every contributing owner.
* :func:`unique_exchange` (UB): ``y = unpack_reduce(T(gather_pack(rows, idx, send)),
  recv)``; backward ``grad_rows = unpack_index_add(T'(pack(grad_y, recv)), idx,
  send)``: one summed gradient per unique row and requester, accumulated per row.

``T`` is the transport: a callable ``(buffer, send_split_bytes, recv_split_bytes) ->
received buffer``, e.g. a wrapper of ``dist.all_to_all_single``; ``T'`` is the same
callable with the splits swapped. The default, :func:`loopback`, is a one-rank
exchange (send layout == receive layout), useful for tests and single-process runs.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from lightning_embark.engine.codecs import Codec, codec_by_name
from lightning_embark.errors import ConfigError
from lightning_embark.kernels.layout import ExchangeLayout
from lightning_embark.kernels.ops import gather_pack, pack, unpack_index_add, unpack_reduce

Transport = Callable[[Tensor, list[int], list[int]], Tensor]


def loopback(buffer: Tensor, send_splits: list[int], recv_splits: list[int]) -> Tensor:
    """The single-rank transport: what is sent is what is received."""
    if send_splits != recv_splits:
        raise ConfigError(
            f"loopback transport needs equal send and receive splits, got {send_splits} and {recv_splits}; "
            "pass a real transport for multi-rank exchanges"
        )
    return buffer


def _count(counter: Tensor | None, count: Tensor) -> None:
    if counter is not None:
        counter.add_(count.to(counter.dtype))


class _Exchange(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, send, recv, forward_codec, backward_codec, transport, backend, counter):  # type: ignore[override]
        payload, count = pack(x, send, forward_codec, backend=backend)
        _count(counter, count)
        received = transport(payload, send.split_bytes(forward_codec), recv.split_bytes(forward_codec))
        ctx.args = (send, recv, backward_codec, transport, backend, counter, x.dtype)
        return unpack_reduce(received, recv, forward_codec, backend=backend)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        send, recv, codec, transport, backend, counter, dtype = ctx.args
        payload, count = pack(grad.contiguous(), recv, codec, backend=backend)
        _count(counter, count)
        received = transport(payload, recv.split_bytes(codec), send.split_bytes(codec))
        grad_x = unpack_reduce(received, send, codec, backend=backend).to(dtype)
        return grad_x, None, None, None, None, None, None, None


class _UniqueExchange(torch.autograd.Function):
    @staticmethod
    def forward(ctx, rows, indices, send, recv, forward_codec, backward_codec, transport, backend, counter):  # type: ignore[override]
        payload, count = gather_pack(rows, indices, send, forward_codec, backend=backend)
        _count(counter, count)
        received = transport(payload, send.split_bytes(forward_codec), recv.split_bytes(forward_codec))
        ctx.save_for_backward(indices)
        ctx.args = (send, recv, backward_codec, transport, backend, counter, rows.shape[0], rows.dtype)
        return unpack_reduce(received, recv, forward_codec, backend=backend)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        (indices,) = ctx.saved_tensors
        send, recv, codec, transport, backend, counter, num_rows, dtype = ctx.args
        payload, count = pack(grad.contiguous(), recv, codec, backend=backend)
        _count(counter, count)
        received = transport(payload, recv.split_bytes(codec), send.split_bytes(codec))
        grad_rows = unpack_index_add(received, indices, send, codec, num_rows=num_rows, backend=backend)
        return grad_rows.to(dtype), None, None, None, None, None, None, None, None


def _codec(codec: Codec | str) -> Codec:
    return codec if isinstance(codec, Codec) else codec_by_name(codec)


def exchange(
    x: Tensor,
    *,
    send: ExchangeLayout,
    recv: ExchangeLayout,
    forward_codec: Codec | str,
    backward_codec: Codec | str,
    transport: Transport = loopback,
    backend: str = "auto",
    nonfinite: Tensor | None = None,
) -> Tensor:
    """Differentiable compressed exchange of dense blocks (RB pooled vectors).

    Args:
        x: ``[send.num_rows, send.num_cols]`` fp32/bf16/fp16 rows to send.
        send: What each destination rank gets from ``x``.
        recv: Where each source rank's blocks land in the fp32 output (coinciding
            blocks are summed).
        forward_codec: Wire format of ``x`` (e.g. ``codec_for(c, backward=False)``).
        backward_codec: Wire format of the gradient.
        transport: Moves the byte buffer (see module docstring).
        backend: ``auto``, ``triton`` or ``reference`` (see :mod:`.ops`).
        nonfinite: Optional int64 counter; forward and backward non-finite counts are
            added to it in place (no host sync).

    Returns:
        fp32 ``[recv.num_rows, recv.num_cols]``.
    """
    return _Exchange.apply(
        x, send, recv, _codec(forward_codec), _codec(backward_codec), transport, backend, nonfinite
    )


def unique_exchange(
    rows: Tensor,
    indices: Tensor,
    *,
    send: ExchangeLayout,
    recv: ExchangeLayout,
    forward_codec: Codec | str,
    backward_codec: Codec | str,
    transport: Transport = loopback,
    backend: str = "auto",
    nonfinite: Tensor | None = None,
) -> Tensor:
    """Differentiable unique-row exchange (UB): owners send ``rows[indices]``.

    ``send`` rows are positions in ``indices``; ``recv`` places the received unique
    rows in the requester's fp32 ``[recv.num_rows, recv.num_cols]`` buffer. The
    gradient of ``rows`` is dense (rows nobody asked for are zero); engines with a
    fused sparse optimizer call :func:`~.ops.unpack_index_add` themselves instead.
    Other arguments as in :func:`exchange`.
    """
    return _UniqueExchange.apply(
        rows,
        indices,
        send,
        recv,
        _codec(forward_codec),
        _codec(backward_codec),
        transport,
        backend,
        nonfinite,
    )
