"""Wire formats: the bytes every exchange carries, shared by the engine, the kernels and the
planner.

A :class:`Codec` turns ``[rows, width]`` float blocks into ``uint8 [rows, row_bytes]``
rows and back (fp32, bf16, fp16, row-scaled fp8 and int8), with one non-finite policy
and a proven round-trip :class:`ErrorBound` per format; :func:`codec_for` maps a
plan's :class:`~lightning_embark.plan.Compression` to its codec.
"""

from lightning_embark.wire._codecs import (
    CODECS,
    ERROR_BOUNDS,
    MIN_SCALE,
    Codec,
    EncodeResult,
    ErrorBound,
    align4,
    all_finite,
    codec_by_name,
    codec_for,
    row_bytes,
)

__all__ = [
    "CODECS",
    "ERROR_BOUNDS",
    "MIN_SCALE",
    "Codec",
    "EncodeResult",
    "ErrorBound",
    "align4",
    "all_finite",
    "codec_by_name",
    "codec_for",
    "row_bytes",
]
