"""Custom ops (schemas, fake kernels, torch.compile), dispatch, and the per-block entry points."""

from __future__ import annotations

import math

import pytest
import torch

from lightning_embark.errors import ConfigError
from lightning_embark.kernels import (
    BACKEND_ENV,
    ExchangeLayout,
    RankSlice,
    decode_rows,
    encode_rows,
    pack,
    pack_columns,
    resolve_backend,
    unpack_reduce,
)
from lightning_embark.kernels import _ops as ops
from lightning_embark.wire._codecs import BF16, CODECS, FP8_E4M3, FP32, INT8, Codec

# Two owners send row-shard partials of the same [3, 8] block: y = x[:3] + x[3:].
SEND = ExchangeLayout.from_row_splits([3, 3], [(0, 5), (5, 3)], num_cols=8)
RECV = ExchangeLayout(
    ranks=(RankSlice(row_start=0, row_stop=3, blocks=((0, 5), (5, 3))),) * 2,
    num_rows=3,
    num_cols=8,
)


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_opcheck(backend: str, request: pytest.FixtureRequest) -> None:
    if backend == "triton":
        request.getfixturevalue("triton_cpu")
    x = torch.randn(6, 8)
    segments = list(SEND.segments)
    torch.library.opcheck(torch.ops.embark.pack.default, (x, segments, "int8", backend))
    payload, _ = pack(x, SEND, INT8, backend="reference")
    torch.library.opcheck(
        torch.ops.embark.unpack_reduce.default,
        (payload, list(RECV.segments), "int8", 3, 8, backend),
    )
    torch.library.opcheck(torch.ops.embark.pack.default, (x, segments, "fp8_e5m2", backend))


def test_fake_kernels_give_output_shapes() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(6, 8)
        payload, count = torch.ops.embark.pack(x, list(SEND.segments), "fp8_e4m3", "auto")
        out = torch.ops.embark.unpack_reduce(
            payload, list(RECV.segments), "fp8_e4m3", 3, 8, "auto"
        )
    assert payload.shape == (SEND.total_bytes(FP8_E4M3),) and payload.dtype == torch.uint8
    assert count.shape == () and count.dtype == torch.int64
    assert out.shape == (3, 8) and out.dtype == torch.float32


def test_ops_trace_under_torch_compile(triton_cpu: str) -> None:
    def step(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        payload, count = pack(x * 2, SEND, FP8_E4M3, backend=triton_cpu)
        return unpack_reduce(payload, RECV, FP8_E4M3, backend=triton_cpu) + 1, count

    x = torch.randn(6, 8)
    x[1, 1] = math.inf
    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    (y, count), (y_eager, count_eager) = compiled(x), step(x)
    assert torch.equal(y, y_eager) and int(count) == int(count_eager) == 1


def test_backend_resolution(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = torch.device("cpu")
    monkeypatch.delenv(BACKEND_ENV, raising=False)
    assert resolve_backend(cpu) == "reference"
    assert resolve_backend(torch.device("cuda")) == "triton"
    monkeypatch.setenv(BACKEND_ENV, "reference")
    assert resolve_backend(torch.device("cuda")) == "reference"
    assert resolve_backend(torch.device("cuda"), "triton") == "triton"  # the argument wins
    monkeypatch.setenv(BACKEND_ENV, "cuda")
    with pytest.raises(ConfigError, match="backend 'cuda' unknown"):
        resolve_backend(cpu)
    monkeypatch.setattr(ops, "interpreted", lambda: False)
    with pytest.raises(ConfigError, match="TRITON_INTERPRET=1"):
        resolve_backend(cpu, "triton")


def test_environment_variable_forces_the_kernels(
    triton_cpu: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    real = ops.pack_triton
    monkeypatch.setattr(ops, "pack_triton", lambda *args: calls.append("triton") or real(*args))
    monkeypatch.setenv(BACKEND_ENV, "triton")
    pack(torch.ones(6, 8), SEND, BF16)
    monkeypatch.setenv(BACKEND_ENV, "reference")
    pack(torch.ones(6, 8), SEND, BF16)
    assert calls == ["triton"]


@pytest.mark.parametrize("codec", list(CODECS.values()), ids=lambda c: c.name)
@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_encode_and_decode_rows_are_the_codecs_bytes(codec: Codec, backend: str, request) -> None:
    """The engine's per-block entry points give the codec's bytes and values on both backends,
    for odd widths, bf16 inputs, zero rows and rows with NaN / inf (counted)."""
    if backend == "triton":
        request.getfixturevalue("triton_cpu")
    x = torch.randn(9, 13, generator=torch.Generator().manual_seed(5)) * 3
    x[1, 2], x[4, 0] = float("nan"), float("-inf")
    for block in (x, x.bfloat16(), x[:0], x[:, 3:10]):  # the last one is a strided column slice
        expected = codec.encode(block)
        payload, count = encode_rows(block, codec, backend=backend)
        assert torch.equal(payload, expected.payload), (block.dtype, tuple(block.shape))
        assert int(count) == int(expected.num_nonfinite)
        decoded = decode_rows(payload, codec, block.shape[1], backend=backend)
        assert torch.equal(decoded, codec.decode(expected.payload, block.shape[1]))
    # A slice of a received buffer at an odd byte offset decodes too.
    payload, _ = encode_rows(x, codec, backend=backend)
    buffer = torch.cat([torch.zeros(1, dtype=torch.uint8), payload.reshape(-1)])
    rows = buffer[1:].view(9, codec.row_bytes(13))
    assert torch.equal(decode_rows(rows, codec, 13, backend=backend), codec.decode(payload, 13))


def test_decode_rows_rejects_a_payload_of_the_wrong_width() -> None:
    payload, _ = encode_rows(torch.randn(4, 8), INT8)
    with pytest.raises(ConfigError, match=r"uint8 \[rows, 20\] for width 9"):
        decode_rows(payload, INT8, 9)
    with pytest.raises(ConfigError, match="width >= 1"):
        encode_rows(torch.randn(4, 0), INT8)


def test_reference_unpack_of_one_whole_block_does_not_alias_the_payload() -> None:
    """fp32 decoding is a view of the bytes; the op must still return a tensor of its own."""
    payload, _ = pack(torch.randn(3, 8), SEND_WHOLE, FP32, backend="reference")
    out = unpack_reduce(payload, SEND_WHOLE, FP32, backend="reference")
    out.zero_()
    assert payload.any()


SEND_WHOLE = ExchangeLayout(
    ranks=(RankSlice(row_start=0, row_stop=3, blocks=((0, 8),)),), num_rows=3, num_cols=8
)


def test_eager_calls_skip_the_op_dispatch_and_compiled_calls_use_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Eager wrappers call the implementation (the op's dispatch costs ~0.1 ms per call);
    under torch.compile the registered op is what gets traced."""
    assert ops._op(torch.ops.embark.pack, ops._pack) is ops._pack
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert ops._op(torch.ops.embark.pack, ops._pack) is torch.ops.embark.pack


# Interleaved widths (8, 4, 8, 4 from two peers, a width-4 pair summed): the reference stacks
# each width's segments into one codec call.
MIXED = ExchangeLayout(
    ranks=(
        RankSlice(row_start=0, row_stop=5, blocks=((0, 8), (8, 4), (12, 8))),
        RankSlice(row_start=0, row_stop=5, blocks=((8, 4), (20, 4))),
    ),
    num_rows=5,
    num_cols=24,
)


def _mixed_input() -> torch.Tensor:
    x = torch.randn(5, 24)
    x[1, 3], x[2, 9], x[4, 21] = math.nan, math.inf, -math.inf
    return x


@pytest.mark.parametrize("codec", list(CODECS.values()), ids=lambda c: c.name)
def test_reference_ops_are_the_codecs_segment_by_segment(codec: Codec) -> None:
    """The per-width batching of the reference gives each segment's own encoding, and the
    unpack adds the decoded partials to zeros in buffer order, as one call per segment did."""
    from lightning_embark.kernels._exchange_layout import iter_segments

    x = _mixed_input()
    segments = iter_segments(MIXED.segments)
    encoded = [codec.encode(x[r0 : r0 + n, c0 : c0 + w].contiguous()) for r0, n, c0, w in segments]
    payload, count = pack(x, MIXED, codec, backend="reference")
    assert torch.equal(payload, torch.cat([e.payload.reshape(-1) for e in encoded]))
    assert int(count) == sum(int(e.num_nonfinite) for e in encoded)
    expected = torch.zeros(5, 24)
    for (r0, n, c0, w), e in zip(segments, encoded, strict=True):
        expected[r0 : r0 + n, c0 : c0 + w] += codec.decode(e.payload, w)
    out = unpack_reduce(payload, MIXED, codec, backend="reference")
    assert torch.equal(out.view(torch.int32), expected.view(torch.int32))


@pytest.mark.parametrize("codec", [FP32, BF16, FP8_E4M3, INT8], ids=lambda c: c.name)
def test_pack_columns_is_pack_of_the_concatenation(codec: Codec) -> None:
    x = _mixed_input()
    parts = list(torch.split(x, [8, 4, 8, 4], dim=1))
    payload, count = pack(x, MIXED, codec, backend="reference")
    got, got_count = pack_columns(parts, MIXED, codec, backend="reference")
    assert torch.equal(got, payload) and int(got_count) == int(count)
    # A segment straddling two parts falls back to the concatenation.
    uneven = list(torch.split(x, [6, 18], dim=1))
    assert torch.equal(pack_columns(uneven, MIXED, codec, backend="reference")[0], payload)
    with pytest.raises(ConfigError, match="do not make"):
        pack_columns(parts[:2], MIXED, codec, backend="reference")
