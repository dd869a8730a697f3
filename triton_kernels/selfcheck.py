"""Randomised check of the Triton kernels on a device against the reference ops on the CPU.

The test suite runs the kernels in Triton's interpreter, which cannot see what only
compiled code does: alignment hints (``tl.multiple_of``), vectorised unmasked paths,
column-chunk loops at real block sizes, launch grids at real sizes. This check runs
the compiled kernels on the device with the cases that exercise those paths (odd and
wide widths, unaligned column offsets, zero-row ranks, several row runs per peer,
row-shard partials to sum, bf16 / fp16 inputs, NaN and inf, received buffers sliced at odd byte
offsets) and requires the reference's
bytes and values bit for bit.

    python -m lightning_embark.kernels.selfcheck [--cases 200] [--seed 0]

On a CPU it runs in the interpreter (set ``TRITON_INTERPRET=1`` before triton is
imported), which is how the test suite keeps it working.
"""

from __future__ import annotations

import argparse
import random
import sys
from dataclasses import dataclass

import torch
from torch import Tensor

from lightning_embark.kernels._exchange_layout import ExchangeLayout, RankSlice
from lightning_embark.kernels._ops import pack, unpack_reduce
from lightning_embark.wire import CODECS, Codec

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@dataclass(frozen=True, kw_only=True)
class CaseResult:
    """One randomised case: which op, format and input, and whether it matched."""

    op: str
    codec: str
    dtype: str
    shape: tuple[int, int]
    num_segments: int
    ok: bool
    detail: str = ""


def _widths(rng: random.Random, count: int, wide: bool) -> list[int]:
    choices = [1, 3, 4, 7, 8, 16, 33, 64, 128, 129] + ([300, 512, 1030] if wide else [])
    return [rng.choice(choices) for _ in range(count)]


def rb_case(rng: random.Random, wide: bool) -> tuple[ExchangeLayout, ExchangeLayout, int, int]:
    """A requester's RB exchange: (stacked send layout, receive layout, rows, cols).

    Sources send rows ``[0, B)`` of a random subset of the column blocks (blocks sent
    by several sources are row-shard partials); one source may send nothing, and a
    column gap at the front makes every block start unaligned.
    """
    widths = _widths(rng, rng.randint(1, 4), wide)
    gap = rng.choice([0, 1, 3])
    starts = [gap + sum(widths[:i]) for i in range(len(widths))]
    blocks = list(zip(starts, widths, strict=True))
    batch, sources = rng.choice([0, 1, 5, 17, 64, 200]), rng.randint(1, 5)
    chosen = [
        rng.sample(blocks, rng.randint(0 if s == sources - 1 else 1, len(blocks)))
        for s in range(sources)
    ]
    cols = gap + sum(widths)
    send = ExchangeLayout(
        ranks=tuple(
            RankSlice(row_start=s * batch, row_stop=(s + 1) * batch, blocks=tuple(b))
            for s, b in enumerate(chosen)
        ),
        num_rows=batch * sources,
        num_cols=cols,
    )
    recv = ExchangeLayout(
        ranks=tuple(RankSlice(row_start=0, row_stop=batch, blocks=tuple(b)) for b in chosen),
        num_rows=batch,
        num_cols=cols,
    )
    return send, recv, batch * sources, cols


def multi_run_case(rng: random.Random, wide: bool) -> tuple[ExchangeLayout, int, int]:
    """The UB requester's layout: peers answer several row runs, each with its own block."""
    widths = _widths(rng, 2, wide)
    cols = max(widths)
    runs = [rng.choice([0, 1, 9, 40]) for _ in range(rng.randint(2, 6))]
    firsts = [sum(runs[:i]) for i in range(len(runs))]
    slices = [
        RankSlice(row_start=f, row_stop=f + n, blocks=((0, rng.choice(widths)),))
        for f, n in zip(firsts, runs, strict=True)
    ]
    split = rng.randint(0, len(slices))
    layout = ExchangeLayout(
        ranks=(tuple(slices[:split]), tuple(slices[split:])), num_rows=sum(runs), num_cols=cols
    )
    return layout, sum(runs), cols


def _values(rows: int, cols: int, dtype: torch.dtype, seed: int, nonfinite: bool) -> Tensor:
    # Drawn on the host (the reference side of every comparison; the GPU gets a copy).
    g = torch.Generator(device="cpu").manual_seed(seed)
    scale = torch.exp(torch.randn(rows, 1, generator=g, device="cpu") * 3)  # varied magnitudes
    x = torch.randn(rows, cols, generator=g, device="cpu") * scale
    if nonfinite and x.numel():
        flat = x.view(-1)
        for value in (float("nan"), float("inf"), float("-inf")):
            flat[int(torch.randint(flat.numel(), (1,), generator=g, device="cpu"))] = value
    return x.to(dtype)  # fp16 overflows to inf on some rows: the policy's saturation, checked too


def _same(actual: Tensor, expected: Tensor) -> tuple[bool, str]:
    actual = actual.cpu()
    if actual.shape != expected.shape:
        return False, f"shape {tuple(actual.shape)} vs {tuple(expected.shape)}"
    if actual.dtype == torch.uint8:
        differing = int((actual != expected).sum())
        return differing == 0, f"{differing} bytes differ" if differing else ""
    same = torch.equal(actual, expected) or bool(
        ((actual == expected) | (actual.isnan() & expected.isnan())).all()
    )
    diff = (
        float((actual - expected).nan_to_num().abs().max()) if actual.numel() and not same else 0.0
    )
    return same, "" if same else f"max |diff| {diff:.3g}"


def run_case(
    index: int, rng: random.Random, device: torch.device, *, wide: bool
) -> list[CaseResult]:
    """One randomised case of each kind for one codec and input dtype."""
    codec: Codec = rng.choice(list(CODECS.values()))
    dtype = rng.choice(DTYPES)
    nonfinite = rng.random() < 0.3
    results = []

    def record(op: str, shape: tuple[int, int], segments: int, check: tuple[bool, str]) -> None:
        results.append(
            CaseResult(
                op=op,
                codec=codec.name,
                dtype=str(dtype).removeprefix("torch."),
                shape=shape,
                num_segments=segments,
                ok=check[0],
                detail=check[1],
            )
        )

    send, recv, rows, cols = rb_case(rng, wide)
    x = _values(rows, cols, dtype, index, nonfinite)
    payload, count = pack(x.to(device), send, codec, backend="triton")
    expected, expected_count = pack(x, send, codec, backend="reference")
    ok, detail = _same(payload, expected)
    if ok and int(count) != int(expected_count):
        ok, detail = False, f"non-finite count {int(count)} vs {int(expected_count)}"
    record("pack", (rows, cols), len(send.segments) // 4, (ok, detail))
    # The requester's side of the same bytes; an odd byte offset forces the unaligned path.
    shifted = torch.cat([expected.new_zeros(1), expected])[1:]
    out = unpack_reduce(shifted.to(device), recv, codec, backend="triton")
    record(
        "unpack_reduce",
        (recv.num_rows, cols),
        len(recv.segments) // 4,
        _same(out, unpack_reduce(expected, recv, codec, backend="reference")),
    )

    runs, run_rows, run_cols = multi_run_case(rng, wide)
    y = _values(run_rows, run_cols, dtype, index + 2, nonfinite)
    packed, _ = pack(y.to(device), runs, codec, backend="triton")
    packed_ref, _ = pack(y, runs, codec, backend="reference")
    record(
        "pack (row runs)", (run_rows, run_cols), len(runs.segments) // 4, _same(packed, packed_ref)
    )
    record(
        "unpack (row runs)",
        (run_rows, run_cols),
        len(runs.segments) // 4,
        _same(
            unpack_reduce(packed_ref.to(device), runs, codec, backend="triton"),
            unpack_reduce(packed_ref, runs, codec, backend="reference"),
        ),
    )
    return results


def run_checks(
    device: torch.device, *, num_cases: int, seed: int = 0, wide: bool = True
) -> list[CaseResult]:
    """``num_cases`` randomised cases (four ops each) on ``device`` against the CPU reference."""
    rng = random.Random(seed)
    results: list[CaseResult] = []
    for index in range(num_cases):
        results += run_case(seed * 1_000_003 + index, rng, device, wide=wide)
    return results


def summary(results: list[CaseResult]) -> str:
    """Per op: cases and failures, then the first failures in full."""
    ops = sorted({r.op for r in results})
    lines = ["| op | cases | bit-identical to the reference |", "|---|---:|---|"]
    for op in ops:
        mine = [r for r in results if r.op == op]
        bad = sum(not r.ok for r in mine)
        lines.append(f"| {op} | {len(mine)} | {'all' if not bad else f'{bad} FAILED'} |")
    failures = [r for r in results if not r.ok]
    lines += [
        f"FAILED {r.op} {r.codec} {r.dtype} shape={r.shape} segments={r.num_segments}: {r.detail}"
        for r in failures[:20]
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=200, help="randomised cases (four ops each)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.cases < 1:
        parser.error(f"--cases must be positive, got {args.cases}")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    results = run_checks(device, num_cases=args.cases, seed=args.seed, wide=device.type == "cuda")
    print(
        "device: "
        f"{torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu (Triton interpreter)'}"
    )
    print(summary(results))
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
