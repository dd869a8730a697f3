"""Triton kernels for the fused compressed exchange, installed as ``lightning_embark.kernels``.

Each kernel comes as a private ``@triton.jit`` function, a public launcher and a
pure-torch reference op that is both the test oracle and the CPU path. The wire
format is the codecs' (:mod:`lightning_embark.wire`), bit for bit.

* :func:`pack`: quantise-and-pack dense rows into the send buffer (one pass).
* :func:`unpack_reduce`: unpack-dequantise-reduce into the dense output, summing
  row-shard partials (one pass).
* :func:`encode_rows` / :func:`decode_rows`: one whole block, as the codecs do it (the
  engine's per-block path, dispatched like the other ops).

Modules: ``exchange_layout`` (who gets what), ``jit_codecs`` (device codec functions),
``packing``, ``unpacking`` (kernels and launchers), ``reference`` (torch ops), ``ops``
(``torch.library`` registration and dispatch), ``selfcheck``
(``python -m lightning_embark.kernels.selfcheck``: the compiled kernels on a GPU against
the reference, bit for bit). Nothing here imports the engine.
"""

from lightning_embark.kernels.exchange_layout import ColumnBlock, ExchangeLayout, RankSlice
from lightning_embark.kernels.ops import (
    BACKEND_ENV,
    decode_rows,
    encode_rows,
    pack,
    resolve_backend,
    unpack_reduce,
)

__all__ = [
    "BACKEND_ENV",
    "ColumnBlock",
    "ExchangeLayout",
    "RankSlice",
    "decode_rows",
    "encode_rows",
    "pack",
    "resolve_backend",
    "unpack_reduce",
]
