"""A differentiable compressed exchange of dense rows: pack -> transport -> unpack, and back.

The wire buffer is ``uint8``, so autograd cannot flow through the kernels' ops one by
one. Instead the whole exchange is one autograd function. Pack and unpack-reduce are
adjoint (pack copies blocks out, unpack sums blocks in), so the backward of

    ``y = unpack_reduce(T(pack(x, send)), recv)``

is the same exchange reversed with the backward codec,

    ``grad_x = unpack_reduce(T'(pack(grad_y, recv)), send)``:

the gradient of a sum of partials goes back to every contributor. ``T`` is the
transport, a callable ``(buffer, send_split_bytes, recv_split_bytes) -> received``;
``T'`` is the same callable with the splits swapped. :func:`over` makes one from an
:class:`~lightning_embark.exchange._alltoall.AllToAll` (flat or hierarchical, any
process group); :func:`loopback` is the one-rank transport.

This is the exchange a module's dense output takes when it must come back to the
ranks that own the samples (a tower's output crossing hosts); the engine's embedding
clusters do not use it, since they apply their optimizer inside their own backward.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from lightning_embark.errors import ConfigError
from lightning_embark.exchange._alltoall import AllToAll
from lightning_embark.kernels import ExchangeLayout, pack, unpack_reduce
from lightning_embark.wire import Codec, codec_by_name

Transport = Callable[[Tensor, list[int], list[int]], Tensor]


def loopback(buffer: Tensor, send_splits: list[int], recv_splits: list[int]) -> Tensor:
    """The single-rank transport: what is sent is what is received."""
    if send_splits != recv_splits:
        raise ConfigError(
            f"loopback transport needs equal send and receive splits, got {send_splits} and "
            f"{recv_splits}; pass a real transport for multi-rank exchanges"
        )
    return buffer


def over(exchange: AllToAll) -> Transport:
    """The transport of ``exchange``: one variable-size all-to-all of the byte buffer."""

    def transport(buffer: Tensor, send_splits: list[int], recv_splits: list[int]) -> Tensor:
        received, _ = exchange(buffer, send_splits, recv_splits)
        return received

    return transport


def _count(counter: Tensor | None, count: Tensor | int) -> None:
    if counter is not None:
        counter.add_(torch.as_tensor(count, dtype=counter.dtype, device=counter.device))


class _Exchange(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        x: Tensor,
        send: ExchangeLayout,
        recv: ExchangeLayout,
        forward_codec: Codec,
        backward_codec: Codec,
        transport: Transport,
        backend: str,
        counter: Tensor | None,
    ) -> Tensor:
        payload, count = pack(x, send, forward_codec, backend=backend)
        _count(counter, count)
        received = transport(
            payload, send.split_bytes(forward_codec), recv.split_bytes(forward_codec)
        )
        ctx.args = (send, recv, backward_codec, transport, backend, counter, x.dtype)
        return unpack_reduce(received, recv, forward_codec, backend=backend)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        send, recv, codec, transport, backend, counter, dtype = ctx.args
        payload, count = pack(grad.contiguous(), recv, codec, backend=backend)
        _count(counter, count)
        received = transport(payload, recv.split_bytes(codec), send.split_bytes(codec))
        grad_x = unpack_reduce(received, send, codec, backend=backend).to(dtype)
        return grad_x, None, None, None, None, None, None, None


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
    """Differentiable compressed exchange of dense blocks.

    Args:
        x: ``[send.num_rows, send.num_cols]`` fp32/bf16/fp16 rows to send.
        send: What each destination rank gets from ``x``.
        recv: Where each source rank's blocks land in the fp32 output (coinciding
            blocks are summed).
        forward_codec: Wire format of ``x`` (e.g. ``codec_for(c, backward=False)``).
        backward_codec: Wire format of the gradient.
        transport: Moves the byte buffer (see the module docstring).
        backend: ``auto``, ``triton`` or ``reference`` (see :mod:`lightning_embark.kernels`).
        nonfinite: Optional int64 counter; forward and backward non-finite counts are
            added to it in place (no host sync).

    Returns:
        fp32 ``[recv.num_rows, recv.num_cols]``.
    """
    out: Tensor = _Exchange.apply(
        x, send, recv, _codec(forward_codec), _codec(backward_codec), transport, backend, nonfinite
    )
    return out
