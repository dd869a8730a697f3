"""Device functions shared by the kernels: the codecs' wire format, bit for bit.

Why not plain ``x.to(tl.float8e4nv)`` / ``x.to(tl.bfloat16)``: Triton's interpreter
truncates those casts while the GPU rounds to nearest even, so tests on the CPU
would not check what runs on the GPU. The fp8 and bf16 codes are therefore built
with integer arithmetic (round to nearest even, as torch's casts), which both
execute identically; fp16 uses the native cast, exact in numpy and on the GPU.
Every fp32 operation mirrors the torch codec's sequence (launch with
``enable_fp_fusion=False`` so no FMA contraction changes a rounding).

Format ids (``FMT``): 0 fp32, 1 bf16, 2 fp16, 3 fp8 e4m3, 4 fp8 e5m2, 5 int8.
"""

from __future__ import annotations

import triton
import triton.language as tl

FORMAT_IDS = {"fp32": 0, "bf16": 1, "fp16": 2, "fp8_e4m3": 3, "fp8_e5m2": 4, "int8": 5}


_FP32_MAX = tl.constexpr(3.4028234663852886e38)
_BF16_MAX = tl.constexpr(3.3895313892515355e38)
_FP16_MAX = tl.constexpr(65504.0)
_MIN_SCALE = tl.constexpr(2.0**-126)
_TWO_23 = tl.constexpr(8388608.0)


@triton.jit
def align4(n):
    return (n + 3) // 4 * 4


@triton.jit
def row_bytes(width, FMT: tl.constexpr):
    """Bytes per wire row (the codecs' ``row_bytes``)."""
    if FMT == 0:
        rb = width * 4
    elif FMT == 1 or FMT == 2:
        rb = width * 2
    elif FMT == 5:
        rb = align4(width) + 8
    else:
        rb = align4(width) + 4
    return rb


@triton.jit
def tile_mask(
    rmask, cols, width, BLOCK_R: tl.constexpr, BLOCK_W: tl.constexpr, FULL: tl.constexpr
):
    """Mask of a ``[BLOCK_R, BLOCK_W]`` tile; ``FULL`` (every width is ``BLOCK_W``) keeps it
    constant along columns, so loads and stores can be vectorised."""
    if FULL:
        m = tl.broadcast_to(rmask[:, None], [BLOCK_R, BLOCK_W])
    else:
        m = rmask[:, None] & (cols[None, :] < width)
    return m


@triton.jit
def load_values(x_ptr, src, cols, m, IN_BF16: tl.constexpr):
    """fp32 tile ``x[src + cols]``; bf16 inputs come in as int16 bits (exact widening)."""
    ptrs = x_ptr + (src[:, None] + cols[None, :])
    if IN_BF16:
        bits = tl.load(ptrs, mask=m, other=0).to(tl.int32) & 0xFFFF
        x = (bits << 16).to(tl.float32, bitcast=True)
    else:
        x = tl.load(ptrs, mask=m, other=0.0).to(tl.float32)
    return x


@triton.jit
def chunk_stats(x, m, a, b, FMT: tl.constexpr):
    """NaN -> 0, count non-finite values, and fold the chunk into the row statistics.

    ``a``/``b`` are the running finite ``amax`` (fp8) or ``min``/``max`` (int8).
    """
    finite = tl.abs(x) <= _FP32_MAX
    bad = tl.sum((m & ~finite).to(tl.int32), axis=1)
    x = tl.where(x != x, 0.0, x)
    ok = m & (tl.abs(x) <= _FP32_MAX)
    if FMT == 3 or FMT == 4:
        a = tl.maximum(a, tl.max(tl.where(ok, tl.abs(x), 0.0), axis=1))
    elif FMT == 5:
        a = tl.minimum(a, tl.min(tl.where(ok, x, float("inf")), axis=1))
        b = tl.maximum(b, tl.max(tl.where(ok, x, float("-inf")), axis=1))
    return x, bad, a, b


@triton.jit
def row_params(a, b, FMT: tl.constexpr):
    """Per-row (p0, p1, p2, scale) of the scaled formats from the row statistics.

    fp8: p0 = amax, p1 = 1 / scale. int8: p0 = min, p1 = max, p2 = 2 / scale.
    """
    if FMT == 5:
        empty = a > b
        lo = tl.where(empty, 0.0, a)
        hi = tl.where(empty, 0.0, b)
        scale = tl.maximum(
            tl.math.div_rn(hi * 0.5 - lo * 0.5, tl.full(lo.shape, 127.5, tl.float32)), _MIN_SCALE
        )
        return lo, hi, tl.math.div_rn(tl.full(lo.shape, 2.0, tl.float32), scale), scale
    if FMT == 3:
        fmax = tl.full(a.shape, 448.0, tl.float32)
    else:
        fmax = tl.full(a.shape, 57344.0, tl.float32)
    scale = tl.maximum(tl.math.div_rn(a, fmax), _MIN_SCALE)
    return a, tl.math.div_rn(tl.full(a.shape, 1.0, tl.float32), scale), b, scale


@triton.jit
def fp8_bits(y, MANT: tl.constexpr, BIAS: tl.constexpr, SUB_SCALE: tl.constexpr):
    """fp8 code of finite, in-range fp32 ``y``, rounded to nearest even (as torch)."""
    bits = y.to(tl.int32, bitcast=True)
    sign = (bits >> 31) & 1
    a = bits & 0x7FFFFFFF
    SHIFT: tl.constexpr = 23 - MANT
    normal = ((a + ((1 << (SHIFT - 1)) - 1) + ((a >> SHIFT) & 1)) >> SHIFT) - (
        (127 - BIAS) << MANT
    )
    # Below the smallest normal the code is round(|y| / step): the 2**23 trick rounds
    # to nearest even in plain fp32 adds (capped at 16 > 2**MANT: only small values use it).
    steps = tl.minimum(a.to(tl.float32, bitcast=True) * SUB_SCALE, 16.0)
    sub = ((steps + _TWO_23) - _TWO_23).to(tl.int32)
    code = tl.where(a < ((128 - BIAS) << 23), sub, normal)
    return code | (sign << 7)


@triton.jit
def fp8_value(code, MANT: tl.constexpr, BIAS: tl.constexpr, SUB_STEP: tl.constexpr):
    """fp32 value of an fp8 code (int32 in [0, 255])."""
    e = (code >> MANT) & ((1 << (7 - MANT)) - 1)
    m = code & ((1 << MANT) - 1)
    normal = (((e + (127 - BIAS)) << 23) | (m << (23 - MANT))).to(tl.float32, bitcast=True)
    value = tl.where(e == 0, m.to(tl.float32) * SUB_STEP, normal)
    return tl.where(((code >> 7) & 1) == 1, -value, value)


@triton.jit
def encode_chunk(x, cols, width, p0, p1, p2, FMT: tl.constexpr):
    """Wire values of a tile (NaN already 0): fp32 values or integer codes (pads = 0)."""
    if FMT == 0:
        out = tl.minimum(tl.maximum(x, -_FP32_MAX), _FP32_MAX)
    elif FMT == 1:
        y = tl.minimum(tl.maximum(x, -_BF16_MAX), _BF16_MAX)
        bits = y.to(tl.int32, bitcast=True)
        a = bits & 0x7FFFFFFF
        out = ((a + 0x7FFF + ((a >> 16) & 1)) >> 16) | (((bits >> 31) & 1) << 15)
    elif FMT == 2:
        y = tl.minimum(tl.maximum(x, -_FP16_MAX), _FP16_MAX)
        out = y.to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32)
    elif FMT == 5:
        lo = p0[:, None]
        hi = p1[:, None]
        y = tl.where(x > hi, hi, tl.where(x < lo, lo, x))
        q = tl.floor((y * 0.5 - lo * 0.5) * p2[:, None] + 0.5)
        q = tl.minimum(tl.maximum(q, 0.0), 255.0).to(tl.int32)
        out = tl.where(cols[None, :] < width, q, 0)
    else:
        amax = p0[:, None]
        y = tl.where(x > amax, amax, tl.where(x < -amax, -amax, x)) * p1[:, None]
        if FMT == 3:
            y = tl.minimum(tl.maximum(y, -448.0), 448.0)
            code = fp8_bits(y, 3, 7, 512.0)
        else:
            y = tl.minimum(tl.maximum(y, -57344.0), 57344.0)
            code = fp8_bits(y, 2, 15, 65536.0)
        out = tl.where(cols[None, :] < width, code, 0)
    return out


@triton.jit
def store_chunk(out8, out16, out32, dst, cols, m, values, FMT: tl.constexpr):
    """Store a tile of wire values at byte offsets ``dst`` (row starts) + column."""
    if FMT == 0:
        tl.store(out32 + ((dst // 4)[:, None] + cols[None, :]), values, mask=m)
    elif FMT == 1 or FMT == 2:
        tl.store(out16 + ((dst // 2)[:, None] + cols[None, :]), values.to(tl.int16), mask=m)
    else:
        tl.store(out8 + (dst[:, None] + cols[None, :]), values.to(tl.uint8), mask=m)


@triton.jit
def decode_chunk(in8, in16, in32, src, cols, m, rmask, width, FMT: tl.constexpr):
    """fp32 tile decoded from wire rows starting at byte offsets ``src``.

    ``width`` may be a scalar or one value per row (the unique-row kernel).
    """
    if FMT == 0:
        value = tl.load(in32 + ((src // 4)[:, None] + cols[None, :]), mask=m, other=0.0)
    elif FMT == 1:
        bits = (
            tl.load(in16 + ((src // 2)[:, None] + cols[None, :]), mask=m, other=0).to(tl.int32)
            & 0xFFFF
        )
        value = (bits << 16).to(tl.float32, bitcast=True)
    elif FMT == 2:
        half = tl.load(in16 + ((src // 2)[:, None] + cols[None, :]), mask=m, other=0).to(
            tl.float16, bitcast=True
        )
        value = half.to(tl.float32)
    else:
        code = tl.load(in8 + (src[:, None] + cols[None, :]), mask=m, other=0).to(tl.int32)
        words = (src + align4(width)) // 4
        scale = tl.load(in32 + words, mask=rmask, other=0.0)
        if FMT == 5:
            bias = tl.load(in32 + words + 1, mask=rmask, other=0.0)
            value = code.to(tl.float32) * (scale * 0.5)[:, None] + (bias * 0.5)[:, None]
            value = tl.minimum(tl.maximum(value * 2.0, -_FP32_MAX), _FP32_MAX)
        elif FMT == 3:
            value = fp8_value(code, 3, 7, 2.0**-9) * scale[:, None]
        else:
            value = fp8_value(code, 2, 15, 2.0**-16) * scale[:, None]
    return value
