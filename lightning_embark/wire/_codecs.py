"""Wire codecs for the engine's exchanges: rows of floats in, rows of bytes out.

Every exchange of pooled vectors, unique rows and their gradients goes through a
:class:`Codec`. A codec turns a block ``x[rows, width]`` (fp32, bf16 or fp16) into a
``uint8`` tensor ``[rows, row_bytes(width)]`` so one ``all_to_all_single`` on a byte
buffer carries any format, and decodes it back to fp32. The Triton kernels in
``lightning_embark.kernels`` write and read exactly these bytes.

Wire format per row (little-endian, ``A = align4(width)``):

=========  ====================  ==============================================
codec      row_bytes(width)      layout
=========  ====================  ==============================================
fp32       ``4 * width``         fp32 values
bf16       ``2 * width``         bf16 values (round to nearest even)
fp16       ``2 * width``         fp16 values (round to nearest even)
fp8_e4m3   ``A + 4``             e4m3fn codes, zero padding, fp32 ``scale``
fp8_e5m2   ``A + 4``             e5m2 codes, zero padding, fp32 ``scale``
int8       ``A + 8``             uint8 codes, zero padding, fp32 ``scale``, fp32 ``bias``
=========  ====================  ==============================================

The padding keeps every row of the scaled formats 4-byte aligned, so kernels store
the scales as fp32 words. fp8: ``scale = max(amax / fmax, 2**-126)`` with ``amax``
the row's largest finite magnitude, codes ``= clamp(x / scale)`` (computed as ``x *
(1 / scale)``), decoded ``code * scale``. int8 is asymmetric like fbgemm's
fused 8-bit row-wise format: ``bias = min``, ``scale = max(range / 255, 2**-126)``,
``q = floor((x - bias) / scale + 0.5)`` in ``[0, 255]``, decoded ``q * scale + bias``;
both are evaluated on halved operands so rows spanning nearly the whole fp32 range do
not overflow. Scaling is per encoded row, so the engine encodes each destination
block (a table's column block for a batch of samples) separately.

Non-finite policy (identical for every codec and in the Triton kernels):

* NaN encodes as 0.
* ``+inf`` / ``-inf`` saturate to the largest / lowest value the row's encoding can
  hold: ``+-fmax`` of the format for fp32, bf16 and fp16; ``+-amax`` of the row's
  finite values for fp8; the row's finite ``max`` / ``min`` for int8. Scales are
  computed from finite values only, so one inf does not wipe out a row; a row with
  no finite value encodes as zeros.
* Finite values beyond a cast format's range saturate to ``+-fmax`` (not counted).
* :attr:`EncodeResult.num_nonfinite` counts the NaN and inf inputs, so the engine
  can raise or count; encoding itself never fails on them.

Round-trip error bounds are the :data:`ERROR_BOUNDS` constants: for finite ``x``
within the format's range, element-wise
``|decode(encode(x)) - x| <= rel * |x| + row * amax_row + abs``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import Tensor

from lightning_embark._host_work import host_only
from lightning_embark.errors import ConfigError
from lightning_embark.plan import Compression

FP32_MAX = torch.finfo(torch.float32).max
#: Floor for the per-row scale of fp8 and int8: keeps ``1 / scale`` finite.
MIN_SCALE = 2.0**-126
INPUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@dataclass(frozen=True, kw_only=True)
class ErrorBound:
    """Element-wise round-trip bound ``rel * |x| + row * amax_row + abs``.

    Attributes:
        rel: Factor of the element's own magnitude (rounding of a cast or fp8 code).
        row: Factor of the row's largest finite magnitude (quantisation step of
            scaled formats).
        abs: Absolute floor (subnormal spacing, scale floor).
    """

    rel: float
    row: float
    abs: float

    def __post_init__(self) -> None:
        for name in ("rel", "row", "abs"):
            if not getattr(self, name) >= 0.0:
                raise ConfigError(f"ErrorBound.{name} must be >= 0, got {getattr(self, name)}")

    def limit(self, x: Tensor) -> Tensor:
        """Allowed absolute error per element of the finite 2-D block ``x``."""
        xf = x.float().abs()
        amax = xf.amax(dim=1, keepdim=True)
        return self.rel * xf + self.row * amax + self.abs


# Derivations (u = unit roundoff 2**-p of a p-bit significand, fp32 ops add 2**-24 each):
FP32_BOUND = ErrorBound(rel=0.0, row=0.0, abs=0.0)
BF16_BOUND = ErrorBound(rel=2.0**-8, row=0.0, abs=2.0**-134)  # p = 8; half subnormal step
FP16_BOUND = ErrorBound(rel=2.0**-11, row=0.0, abs=2.0**-25)  # p = 11; half of 2**-24
# fp8: code rounding u|y| + half subnormal step (times scale = amax / fmax) + fp32 slack.
FP8_E4M3_BOUND = ErrorBound(rel=2.0**-4 + 2.0**-21, row=2.0**-10 / 448.0, abs=2.0**-125)
FP8_E5M2_BOUND = ErrorBound(rel=2.0**-3 + 2.0**-21, row=2.0**-17 / 57344.0, abs=2.0**-125)
# int8: half a step of range / 255 with range <= 2 * amax, plus fp32 slack.
INT8_BOUND = ErrorBound(rel=0.0, row=1.0 / 255.0 + 2.0**-20, abs=2.0**-125)


@dataclass(frozen=True, kw_only=True)
class EncodeResult:
    """An encoded block.

    Attributes:
        payload: ``uint8 [rows, row_bytes(width)]``.
        num_nonfinite: NaN and inf inputs found (0-d int64 tensor on the input's
            device, so encoding never forces a host sync).
    """

    payload: Tensor
    num_nonfinite: Tensor | int


def align4(n: int) -> int:
    """``n`` rounded up to a multiple of 4 (start of a scaled row's fp32 words)."""
    return (n + 3) & ~3


class Codec:
    """Encodes 2-D float blocks into rows of bytes and back; one instance per format.

    Attributes:
        name: Wire-format name, also used by the Triton kernels (``"fp8_e4m3"``...).
        bound: The round-trip :class:`ErrorBound`.
        fmax: Largest finite value of the element format (codes for fp8, the cast
            type otherwise; 255 for int8's code range).
    """

    name: str
    bound: ErrorBound
    fmax: float

    def row_bytes(self, width: int) -> int:
        """Bytes per encoded row of ``width`` values."""
        raise NotImplementedError

    def _encode(self, x: Tensor, *, finite: bool) -> Tensor:
        """``x`` has no NaN; ``finite`` says it has no inf either (the policy's
        saturation passes may be skipped). Must give the same bytes either way."""
        raise NotImplementedError

    def _decode(self, payload: Tensor, width: int) -> Tensor:
        raise NotImplementedError

    def encode(self, x: Tensor, *, known_finite: bool = False) -> EncodeResult:
        """Encode ``x[rows, width]`` (fp32, bf16 or fp16), applying the non-finite policy.

        Args:
            x: The block.
            known_finite: The caller has already proved every value finite (e.g. one
                check over a whole buffer cut into many blocks), so the check is skipped.
        """
        if x.dim() != 2 or x.dtype not in INPUT_DTYPES:
            raise ConfigError(
                f"{self.name} codec: expected a 2-D fp32/bf16/fp16 tensor, got "
                f"{x.dtype} of shape {tuple(x.shape)}; reshape to [rows, width] and cast"
            )
        _check_width(self, x.shape[1])
        xf = x.float()
        if known_finite or (xf.device.type == "cpu" and all_finite(xf)):
            # A finite sum proves every value finite (one inf or NaN makes it inf or NaN), so
            # the policy's passes can be skipped; on the CPU the check's sync costs nothing.
            return EncodeResult(payload=self._encode(xf, finite=True), num_nonfinite=0)
        nan = torch.isnan(xf)
        num_nonfinite = (~torch.isfinite(xf)).sum()
        xf = torch.where(nan, torch.zeros((), device=xf.device), xf)
        return EncodeResult(payload=self._encode(xf, finite=False), num_nonfinite=num_nonfinite)

    def decode(self, payload: Tensor, width: int) -> Tensor:
        """Decode ``uint8 [rows, row_bytes(width)]`` to fp32 ``[rows, width]``."""
        _check_width(self, width)
        expected = self.row_bytes(width)
        if payload.dtype != torch.uint8 or payload.dim() != 2 or payload.shape[1] != expected:
            raise ConfigError(
                f"{self.name} codec: payload must be uint8 [rows, {expected}] for width {width}, "
                f"got {payload.dtype} of shape {tuple(payload.shape)}; pass the bytes encode "
                "produced"
            )
        payload = payload.contiguous()
        if (
            payload.storage_offset() % 4
        ):  # a slice of a received buffer: dtype views need alignment
            payload = payload.clone()
        return self._decode(payload, width)

    def __repr__(self) -> str:
        return f"Codec({self.name})"


@host_only
def all_finite(x: Tensor) -> bool:
    """Whether every value of ``x`` is finite: one sum (an inf or NaN makes it inf or NaN),
    with a host sync, so meant for CPU tensors (callers branch on the device: host work)."""
    return bool(torch.isfinite(x.float().sum()))


def _check_width(codec: Codec, width: int) -> None:
    if width < 1:
        raise ConfigError(
            f"{codec.name} codec: width must be >= 1, got {width}; skip empty blocks"
        )


class CastCodec(Codec):
    """Plain element cast (fp32, bf16, fp16): no scale, values saturate at ``fmax``."""

    def __init__(self, name: str, dtype: torch.dtype, bound: ErrorBound) -> None:
        self.name, self.dtype, self.bound = name, dtype, bound
        self.fmax = torch.finfo(dtype).max
        self._itemsize = dtype.itemsize

    def row_bytes(self, width: int) -> int:
        return self._itemsize * width

    def _encode(self, x: Tensor, *, finite: bool) -> Tensor:
        # Finite fp32 values are their own saturation: fp32 sends them as they are.
        if finite and self.dtype == torch.float32 and x.dtype == torch.float32:
            return x.contiguous().view(torch.uint8).reshape(x.shape[0], self.row_bytes(x.shape[1]))
        y = x.clamp(-self.fmax, self.fmax).to(self.dtype)
        return y.contiguous().view(torch.uint8).reshape(x.shape[0], self.row_bytes(x.shape[1]))

    def _decode(self, payload: Tensor, width: int) -> Tensor:
        return payload.view(self.dtype).float().reshape(payload.shape[0], width)


class Fp8Codec(Codec):
    """Row-wise scaled fp8: ``scale = amax / fmax`` per row in the trailing fp32 word."""

    def __init__(self, name: str, dtype: torch.dtype, bound: ErrorBound) -> None:
        self.name, self.dtype, self.bound = name, dtype, bound
        self.fmax = torch.finfo(dtype).max

    def row_bytes(self, width: int) -> int:
        return align4(width) + 4

    def _encode(self, x: Tensor, *, finite: bool) -> Tensor:
        rows, width = x.shape
        if finite:
            amax = x.abs().amax(dim=1, keepdim=True)
        else:
            amax = torch.where(torch.isfinite(x), x.abs(), 0.0).amax(dim=1, keepdim=True)
            x = _clamp_rows(x, -amax, amax)  # +-inf -> +-amax
        scale = (amax / self.fmax).clamp_min(MIN_SCALE)
        inv = 1.0 / scale
        a = align4(width)
        payload = torch.empty(rows, self.row_bytes(width), dtype=torch.uint8, device=x.device)
        payload[:, a:] = scale.contiguous().view(torch.uint8)
        if a > width:
            payload[:, width:a] = 0
        payload[:, :width].view(self.dtype).copy_((x * inv).clamp_(-self.fmax, self.fmax))
        return payload

    def _decode(self, payload: Tensor, width: int) -> Tensor:
        a = align4(width)
        codes = payload[:, :width].contiguous()
        if payload.device.type == "cpu" and self.dtype is torch.float8_e4m3fn:
            # The CPU cast from e4m3 has no fast path; a 256-entry table is ~5x faster.
            values = (
                _e4m3_table().index_select(0, codes.reshape(-1).to(torch.int32)).view(codes.shape)
            )
        else:
            values = codes.view(self.dtype).float()
        scale = payload[:, a : a + 4].contiguous().view(torch.float32)
        return values.mul_(scale)


class Int8Codec(Codec):
    """Row-wise asymmetric 8-bit: uint8 codes, fp32 ``scale`` and ``bias`` (row min)."""

    name = "int8"
    bound = INT8_BOUND
    fmax = 255.0

    def row_bytes(self, width: int) -> int:
        return align4(width) + 8

    def _encode(self, x: Tensor, *, finite: bool) -> Tensor:
        rows, width = x.shape
        if finite:
            lo, hi = torch.aminmax(x, dim=1, keepdim=True)
        else:
            is_finite = torch.isfinite(x)
            lo = torch.where(is_finite, x, torch.inf).amin(dim=1, keepdim=True)
            hi = torch.where(is_finite, x, -torch.inf).amax(dim=1, keepdim=True)
            empty = lo > hi  # no finite value in the row
            lo = torch.where(empty, 0.0, lo)
            hi = torch.where(empty, 0.0, hi)
            x = _clamp_rows(x, lo, hi)  # -inf -> min, +inf -> max
        half_lo = lo * 0.5
        scale = ((hi * 0.5 - half_lo) / 127.5).clamp_min(MIN_SCALE)
        inv2 = 2.0 / scale
        q = (x * 0.5).sub_(half_lo).mul_(inv2).add_(0.5).floor_().clamp_(0.0, 255.0)
        a = align4(width)
        payload = torch.empty(rows, self.row_bytes(width), dtype=torch.uint8, device=x.device)
        payload[:, :width].copy_(q)
        if a > width:
            payload[:, width:a] = 0
        payload[:, a:] = torch.cat([scale, lo], dim=1).contiguous().view(torch.uint8)
        return payload

    def _decode(self, payload: Tensor, width: int) -> Tensor:
        a = align4(width)
        words = payload[:, a : a + 8].contiguous().view(torch.float32)
        scale, bias = words[:, :1], words[:, 1:]
        q = payload[:, :width].float()
        return q.mul_(scale * 0.5).add_(bias * 0.5).mul_(2.0).clamp_(-FP32_MAX, FP32_MAX)


@functools.cache
def _e4m3_table() -> Tensor:
    """fp32 value of every e4m3fn code, on the CPU (only CPU payloads use it; cached, so it
    must never land on another default device)."""
    codes = torch.arange(256, dtype=torch.int32, device="cpu").to(torch.uint8)
    return codes.view(torch.float8_e4m3fn).float()


def _clamp_rows(x: Tensor, lo: Tensor, hi: Tensor) -> Tensor:
    """Clamp with explicit comparisons, so -0.0 stays -0.0 exactly as in the kernels."""
    return torch.where(x > hi, hi, torch.where(x < lo, lo, x))


FP32 = CastCodec("fp32", torch.float32, FP32_BOUND)
BF16 = CastCodec("bf16", torch.bfloat16, BF16_BOUND)
FP16 = CastCodec("fp16", torch.float16, FP16_BOUND)
FP8_E4M3 = Fp8Codec("fp8_e4m3", torch.float8_e4m3fn, FP8_E4M3_BOUND)
FP8_E5M2 = Fp8Codec("fp8_e5m2", torch.float8_e5m2, FP8_E5M2_BOUND)
INT8 = Int8Codec()

CODECS: dict[str, Codec] = {c.name: c for c in (FP32, BF16, FP16, FP8_E4M3, FP8_E5M2, INT8)}
ERROR_BOUNDS: dict[str, ErrorBound] = {name: c.bound for name, c in CODECS.items()}


def codec_for(compression: Compression | str, *, backward: bool) -> Codec:
    """The codec of a plan's compression setting (fp8: e4m3 forward, e5m2 backward)."""
    try:
        compression = Compression(compression)
    except ValueError:
        raise ConfigError(
            f"unknown compression {compression!r}; use one of {[c.value for c in Compression]}"
        ) from None
    if compression is Compression.FP8:
        return FP8_E5M2 if backward else FP8_E4M3
    return CODECS[compression.value]


def codec_by_name(name: str) -> Codec:
    """The codec called ``name`` (a key of :data:`CODECS`), as the kernels' ops name them."""
    try:
        return CODECS[name]
    except KeyError:
        raise ConfigError(f"unknown codec {name!r}; use one of {sorted(CODECS)}") from None


@functools.lru_cache(maxsize=4096)
def row_bytes(compression: Compression | str, width: int, *, backward: bool) -> int:
    """Wire bytes of one row of ``width`` values under a plan's compression (cached:
    planners ask often)."""
    return codec_for(compression, backward=backward).row_bytes(width)
