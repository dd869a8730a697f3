"""Wire codecs: formats, round-trip bounds, non-finite policy and input checks."""

from __future__ import annotations

import math

import pytest
import torch

from lightning_embark.errors import ConfigError
from lightning_embark.plan._types import Compression
from lightning_embark.wire._codecs import (
    BF16,
    CODECS,
    ERROR_BOUNDS,
    FP8_E4M3,
    FP8_E5M2,
    FP16,
    FP32,
    FP32_MAX,
    INT8,
    MIN_SCALE,
    Codec,
    ErrorBound,
    align4,
    codec_by_name,
    codec_for,
)

LOSSY = [c for c in CODECS.values() if c is not FP32]
SCALED = [FP8_E4M3, FP8_E5M2, INT8]
INF, NAN = math.inf, math.nan


def _random_block(
    seed: int, rows: int, width: int, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    magnitude = torch.exp(torch.randn(rows, 1, generator=g) * 3)  # rows of very different scales
    x = torch.randn(rows, width, generator=g) * magnitude
    return x.to(dtype)


def _roundtrip(codec: Codec, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    result = codec.encode(x)
    assert result.payload.dtype == torch.uint8
    assert tuple(result.payload.shape) == (x.shape[0], codec.row_bytes(x.shape[1]))
    return codec.decode(result.payload, x.shape[1]), result.num_nonfinite


def _assert_within_bound(codec: Codec, x: torch.Tensor, y: torch.Tensor) -> None:
    assert y.dtype == torch.float32 and y.shape == x.shape
    err = (y - x.float()).abs()
    limit = codec.bound.limit(x)
    worst = (err - limit).max().item() if x.numel() else 0.0
    assert worst <= 0.0, f"{codec.name}: error exceeds bound by {worst}"


@pytest.mark.parametrize("codec", CODECS.values(), ids=lambda c: c.name)
@pytest.mark.parametrize(
    ("seed", "rows", "width"),
    [(0, 0, 5), (1, 1, 1), (2, 7, 3), (3, 33, 17), (4, 64, 128), (5, 5, 257)],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_roundtrip_within_bound(
    codec: Codec, seed: int, rows: int, width: int, dtype: torch.dtype
) -> None:
    x = _random_block(seed, rows, width, dtype)
    if codec is FP16 or dtype is torch.float16:
        x = x.float().clamp(-6e4, 6e4).to(dtype)  # the bound holds inside the format's range
    y, count = _roundtrip(codec, x)
    assert int(count) == 0
    _assert_within_bound(codec, x, y)


@pytest.mark.parametrize("codec", LOSSY, ids=lambda c: c.name)
def test_bounds_are_tight(codec: Codec) -> None:
    """The stated bound is nearly reached, so a too-loose constant would be caught."""
    x = _random_block(7, 256, 64)
    if codec is FP16:
        x = x.clamp(-6e4, 6e4)
    y, _ = _roundtrip(codec, x)
    ratio = ((y - x).abs() / codec.bound.limit(x)).max().item()
    assert 0.5 < ratio <= 1.0


def test_fp32_is_a_lossless_byte_view() -> None:
    x = _random_block(8, 9, 13)
    payload = FP32.encode(x).payload
    assert torch.equal(payload, x.view(torch.uint8))
    assert torch.equal(FP32.decode(payload, 13), x)


@pytest.mark.parametrize(
    ("codec", "dtype"), [(BF16, torch.bfloat16), (FP16, torch.float16)], ids=["bf16", "fp16"]
)
def test_cast_formats_round_to_nearest_even(codec: Codec, dtype: torch.dtype) -> None:
    x = _random_block(9, 16, 31).clamp(-6e4, 6e4)
    assert torch.equal(codec.encode(x).payload.view(dtype), x.to(dtype))


@pytest.mark.parametrize("codec", SCALED, ids=lambda c: c.name)
def test_scaled_wire_layout(codec: Codec) -> None:
    width = 6  # padded to 8, so two padding bytes precede the fp32 words
    x = _random_block(10, 4, width)
    payload = codec.encode(x).payload
    assert codec.row_bytes(width) == align4(width) + (8 if codec is INT8 else 4)
    assert torch.all(payload[:, width : align4(width)] == 0)
    words = payload[:, align4(width) :].contiguous().view(torch.float32)
    if codec is INT8:
        span = (x.amax(1) * 0.5 - x.amin(1) * 0.5) / 127.5
        assert torch.equal(words[:, 0], span.clamp_min(MIN_SCALE))
        assert torch.equal(words[:, 1], x.amin(1))
    else:
        assert torch.equal(words[:, 0], (x.abs().amax(1) / codec.fmax).clamp_min(MIN_SCALE))


@pytest.mark.parametrize("codec", CODECS.values(), ids=lambda c: c.name)
def test_zero_and_constant_rows(codec: Codec) -> None:
    x = torch.zeros(3, 9)
    x[1] = 2.5
    x[2, 4] = -1.0
    y, _ = _roundtrip(codec, x)
    assert torch.equal(y[0], torch.zeros(9))
    assert torch.equal(y[1], x[1])  # 2.5 is exact in every format
    _assert_within_bound(codec, x, y)


@pytest.mark.parametrize("codec", SCALED, ids=lambda c: c.name)
@pytest.mark.parametrize("magnitude", [1e-40, 1e-30, 1e30, 1e38], ids=str)
def test_scaled_formats_at_extreme_magnitudes(codec: Codec, magnitude: float) -> None:
    x = (
        _random_block(11, 8, 19).sign()
        * magnitude
        * torch.rand(8, 19, generator=torch.Generator().manual_seed(1))
    )
    x[0, 0], x[1, 0], x[1, 1] = magnitude, FP32_MAX, -FP32_MAX  # row 1 spans the whole fp32 range
    y, _ = _roundtrip(codec, x)
    assert torch.isfinite(y).all()
    _assert_within_bound(codec, x, y)


@pytest.mark.parametrize(("codec", "big"), [(FP16, 1e6), (BF16, 3.4e38)], ids=["fp16", "bf16"])
def test_cast_formats_saturate_out_of_range_values(codec: Codec, big: float) -> None:
    x = torch.tensor([[big, -big, 1.0]])
    y, count = _roundtrip(codec, x)
    assert y.tolist() == [[codec.fmax, -codec.fmax, 1.0]]
    assert int(count) == 0  # finite inputs are not counted


@pytest.mark.parametrize("codec", [FP32, BF16, FP16], ids=lambda c: c.name)
def test_nonfinite_policy_cast_formats(codec: Codec) -> None:
    x = torch.tensor([[1.0, INF, -INF, NAN, -3.0], [NAN, NAN, 0.5, INF, 2.0]])
    y, count = _roundtrip(codec, x)
    assert int(count) == 6
    assert y.tolist() == [
        [1.0, codec.fmax, -codec.fmax, 0.0, -3.0],
        [0.0, 0.0, 0.5, codec.fmax, 2.0],
    ]


@pytest.mark.parametrize("codec", SCALED, ids=lambda c: c.name)
def test_nonfinite_policy_scaled_formats(codec: Codec) -> None:
    finite = _random_block(12, 6, 11)
    x = finite.clone()
    x[:, 3], x[:, 7], x[2:, 5] = INF, -INF, NAN
    y, count = _roundtrip(codec, x)
    assert int(count) == 6 + 6 + 4
    assert torch.isfinite(y).all()
    # Scales come from finite values only: every finite element keeps the bound it
    # would have without the non-finite ones (NaN counted as the 0 it encodes as).
    reference = torch.where(torch.isnan(x), 0.0, x)
    reference[:, 3] = reference[:, 7] = 0.0
    keep = torch.isfinite(x)
    limit = codec.bound.limit(reference)
    assert torch.all(((y - reference).abs() <= limit)[keep])
    # +inf / -inf saturate to the row's largest / lowest representable value.
    if codec is INT8:
        hi = reference.masked_fill(~keep, -INF).amax(1)
        lo = reference.masked_fill(~keep, INF).amin(1)
    else:
        hi = reference.masked_fill(~keep, 0.0).abs().amax(1)
        lo = -hi
    limit_row = limit.amax(1)
    assert torch.all((y[:, 3] - hi).abs() <= limit_row)
    assert torch.all((y[:, 7] - lo).abs() <= limit_row)
    assert torch.all(y[2:, 5].abs() <= limit_row[2:])  # NaN -> 0


@pytest.mark.parametrize("codec", CODECS.values(), ids=lambda c: c.name)
def test_rows_without_finite_values(codec: Codec) -> None:
    x = torch.tensor([[INF, INF, INF], [NAN, -INF, NAN], [NAN, NAN, NAN]])
    y, count = _roundtrip(codec, x)
    assert int(count) == 9
    expected = (
        torch.zeros(3, 3)
        if codec in SCALED
        else torch.nan_to_num(x, nan=0.0, posinf=codec.fmax, neginf=-codec.fmax)
    )
    assert torch.equal(y, expected)


@pytest.mark.parametrize("codec", CODECS.values(), ids=lambda c: c.name)
def test_rows_encode_independently(codec: Codec) -> None:
    """Each row carries its own scale: the kernels may encode any subset of rows."""
    x = _random_block(13, 10, 21)
    x[4, 2] = INF
    whole = codec.encode(x).payload
    parts = torch.cat([codec.encode(x[i : i + 3]).payload for i in range(0, 10, 3)])
    assert torch.equal(whole, parts)


@pytest.mark.parametrize("codec", CODECS.values(), ids=lambda c: c.name)
@pytest.mark.parametrize(
    ("seed", "rows", "width"), [(15, 0, 3), (16, 9, 1), (17, 33, 30), (18, 4, 129)]
)
def test_finite_fast_path_writes_the_policy_paths_bytes(
    codec: Codec, seed: int, rows: int, width: int
) -> None:
    """All-finite blocks skip the non-finite passes; the bytes must not change."""
    x = _random_block(seed, rows, width)
    if rows:
        x[0] = 0.0
        x[-1, 0] = -0.0
    if codec is FP16:
        x = x.clamp(-6e4, 6e4)
    fast = codec.encode(x)
    assert fast.num_nonfinite == 0
    assert torch.equal(fast.payload, codec._encode(x, finite=False))
    # A caller that proved a whole buffer finite (pack, once for all its blocks) skips the check.
    assert torch.equal(codec.encode(x, known_finite=True).payload, fast.payload)


@pytest.mark.parametrize("codec", CODECS.values(), ids=lambda c: c.name)
def test_finite_sum_overflow_takes_the_policy_path(codec: Codec) -> None:
    x = torch.full((2, 4), 3e38)  # finite values whose sum overflows
    result = codec.encode(x)
    assert int(result.num_nonfinite) == 0
    assert torch.equal(result.payload, codec._encode(x, finite=True))


@pytest.mark.parametrize("codec", CODECS.values(), ids=lambda c: c.name)
def test_decode_accepts_unaligned_slices_of_a_buffer(codec: Codec) -> None:
    x = _random_block(14, 3, 5)
    payload = codec.encode(x).payload
    buffer = torch.cat([torch.zeros(1, dtype=torch.uint8), payload.reshape(-1)])
    assert torch.equal(codec.decode(buffer[1:].view(3, -1), 5), codec.decode(payload, 5))


def test_codec_for_plan_compressions() -> None:
    assert codec_for(Compression.FP8, backward=False) is FP8_E4M3
    assert codec_for("fp8", backward=True) is FP8_E5M2
    for name, codec in (("fp32", FP32), ("bf16", BF16), ("fp16", FP16), ("int8", INT8)):
        assert (
            codec_for(name, backward=False) is codec_for(Compression(name), backward=True) is codec
        )
    assert set(ERROR_BOUNDS) == set(CODECS) and codec_by_name("fp8_e5m2") is FP8_E5M2
    with pytest.raises(ConfigError, match="unknown compression 'fp4'"):
        codec_for("fp4", backward=False)
    with pytest.raises(ConfigError, match="unknown codec"):
        codec_by_name("e4m3")


@pytest.mark.parametrize("codec", CODECS.values(), ids=lambda c: c.name)
def test_bad_inputs_raise_config_errors(codec: Codec) -> None:
    with pytest.raises(ConfigError, match="2-D"):
        codec.encode(torch.ones(4))
    with pytest.raises(ConfigError, match="2-D"):
        codec.encode(torch.ones(2, 2, dtype=torch.int32))
    with pytest.raises(ConfigError, match="width must be >= 1"):
        codec.encode(torch.ones(2, 0))
    payload = codec.encode(torch.ones(2, 5)).payload
    with pytest.raises(ConfigError, match="payload must be uint8"):
        codec.decode(payload, 9)
    with pytest.raises(ConfigError, match="payload must be uint8"):
        codec.decode(payload.float(), 5)


def test_error_bound_validation() -> None:
    with pytest.raises(ConfigError, match="rel must be >= 0"):
        ErrorBound(rel=-1.0, row=0.0, abs=0.0)
    with pytest.raises(ConfigError, match="abs must be >= 0"):
        ErrorBound(rel=0.0, row=0.0, abs=math.nan)
