"""Triton kernels for the fused compressed exchange, installed as ``lightning_embark.kernels``.

Each kernel comes as a private ``@triton.jit`` function, a public launcher and a
pure-torch reference op that is both the test oracle and the CPU path. The wire
format is the codecs' (:mod:`lightning_embark.wire`), bit for bit.

* :func:`pack`: quantise-and-pack dense rows into the send buffer (one pass);
  :func:`pack_columns` the same of blocks of columns given apart (no concatenation
  on the CPU).
* :func:`unpack_reduce`: unpack-dequantise-reduce into the dense output, summing
  row-shard partials (one pass).
* :func:`encode_rows` / :func:`decode_rows`: one whole block, as the codecs do it (the
  engine's per-block path, dispatched like the other ops).

The launchers (:func:`pack_triton`, :func:`unpack_reduce_triton`) and the references
(:func:`pack_reference`, :func:`unpack_reduce_reference`) are public too, for
benchmarks and self-checks that want one backend without the dispatch.

Modules: ``_exchange_layout`` (who gets what), ``_jit_codecs`` (device codec
functions), ``_packing``, ``_unpacking`` (kernels and launchers), ``_reference``
(torch ops), ``_ops`` (``torch.library`` registration and dispatch), ``selfcheck``
(``python -m lightning_embark.kernels.selfcheck``: the compiled kernels on a GPU
against the reference, bit for bit). Nothing here imports the engine.
"""

from lightning_embark.kernels._exchange_layout import ColumnBlock, ExchangeLayout, RankSlice
from lightning_embark.kernels._ops import (
    BACKEND_ENV,
    decode_rows,
    encode_rows,
    interpreted,
    pack,
    pack_columns,
    resolve_backend,
    unpack_reduce,
)
from lightning_embark.kernels._packing import pack_triton
from lightning_embark.kernels._reference import pack_reference, unpack_reduce_reference
from lightning_embark.kernels._unpacking import unpack_reduce_triton

__all__ = [
    "BACKEND_ENV",
    "ColumnBlock",
    "ExchangeLayout",
    "RankSlice",
    "decode_rows",
    "encode_rows",
    "interpreted",
    "pack",
    "pack_columns",
    "pack_reference",
    "pack_triton",
    "resolve_backend",
    "unpack_reduce",
    "unpack_reduce_reference",
    "unpack_reduce_triton",
]
