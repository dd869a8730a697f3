"""Triton kernels for the fused compressed exchange, installed as ``lightning_embark.kernels``.

Each kernel comes as a private ``@triton.jit`` function, a public launcher and a
pure-torch reference op that is both the test oracle and the CPU path. The wire
format is the engine codecs' (:mod:`lightning_embark.engine.codecs`), bit for bit.

* :func:`pack` / :func:`gather_pack`: quantise-and-pack dense or gathered rows into
  the send buffer (one pass).
* :func:`unpack_reduce`: unpack-dequantise-reduce into the dense output, summing
  row-shard partials (one pass).
* :func:`unpack_index_add`: unique-row gradients accumulated per row.
* :func:`exchange` / :func:`unique_exchange`: the differentiable exchanges.
* :func:`encode_rows` / :func:`decode_rows`: one whole block, as the codecs do it (the
  engine's per-block path, dispatched like the other ops).

Modules: ``layout`` (who gets what), ``wire`` (device codec functions), ``packing``,
``unpacking``, ``unique`` (kernels and launchers), ``reference`` (torch ops), ``ops``
(``torch.library`` registration and dispatch), ``exchange`` (autograd), ``selfcheck``
(``python -m lightning_embark.kernels.selfcheck``: the compiled kernels on a GPU against
the reference, bit for bit).
"""

from lightning_embark.kernels.exchange import Transport, exchange, loopback, unique_exchange
from lightning_embark.kernels.layout import ColumnBlock, ExchangeLayout, RankSlice
from lightning_embark.kernels.ops import (
    BACKEND_ENV,
    decode_rows,
    encode_rows,
    gather_pack,
    pack,
    resolve_backend,
    unpack_index_add,
    unpack_reduce,
)

__all__ = [
    "BACKEND_ENV",
    "ColumnBlock",
    "ExchangeLayout",
    "RankSlice",
    "Transport",
    "decode_rows",
    "encode_rows",
    "exchange",
    "gather_pack",
    "loopback",
    "pack",
    "resolve_backend",
    "unique_exchange",
    "unpack_index_add",
    "unpack_reduce",
]
