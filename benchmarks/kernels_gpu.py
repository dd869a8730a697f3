"""Fused exchange kernels vs. the unfused torch path and fbgemm's quantize_comm codecs.

For MLPerf-like shapes (B = 65,536 rows, 26 tables x 128 columns, 8 and 64
destination ranks) it times, per format:

* ``pack``: quantise-and-pack the pooled ``[B, 3328]`` fp32 vectors into the send
  buffer (each rank gets ``B / W`` rows of all 26 column blocks);
* ``unpack``: the adjoint, the received buffer back to ``[B, 3328]`` fp32;

and prints achieved GB/s (bytes read + written), the fraction of the measured
device-to-device copy bandwidth (``torch`` copy of a buffer of the same traffic),
the time of the unfused torch path (the reference ops, which encode block by
block) and of fbgemm's ``QuantizedCommCodec`` (``row_dim=128``, no per-rank
layout, so it does strictly less work), side by side. It also checks the kernel
output against the reference (max abs difference of decoded values).

Before timing anything it runs ``--check-cases`` randomised correctness cases of
:mod:`lightning_embark.kernels.selfcheck` (odd and wide widths, unaligned offsets,
row-shard sums, NaN/inf, bf16/fp16 inputs) on the device against the CPU
reference, bit for bit, and prints that table first: compiled kernels can break where
the interpreter cannot look (alignment hints, unmasked vector paths).

``--smoke`` runs tiny shapes in Triton's interpreter on the CPU (seconds), which is
how the test suite keeps the script working without a GPU.

Usage: ``python benchmarks/kernels_gpu.py [--smoke] [--check-cases 200] [--json out.json]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from typing import TypedDict

if "--smoke" in sys.argv:  # before anything imports triton
    os.environ["TRITON_INTERPRET"] = "1"

import torch

from lightning_embark.kernels import (
    ExchangeLayout,
    pack_reference,
    pack_triton,
    selfcheck,
    unpack_reduce_reference,
    unpack_reduce_triton,
)
from lightning_embark.wire import CODECS, Codec

FBGEMM_TYPES = {"fp16": "FP16", "bf16": "BF16", "fp8_e4m3": "FP8", "int8": "INT8"}


@dataclass(frozen=True, kw_only=True)
class Row:
    ranks: int
    op: str
    format: str
    triton_ms: float
    gbps: float
    copy_fraction: float
    torch_ms: float
    speedup_vs_torch: float
    fbgemm_ms: float | None
    max_abs_diff: float
    bytes_match: bool


def _timer(
    device: torch.device, warmup: int, iters: int
) -> Callable[[Callable[[], object]], float]:
    """Median milliseconds of ``fn`` (CUDA events on GPU, perf_counter on CPU)."""

    def measure(fn: Callable[[], object]) -> float:
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(iters):
            if device.type == "cuda":
                start, stop = (
                    torch.cuda.Event(enable_timing=True),
                    torch.cuda.Event(enable_timing=True),
                )
                start.record()
                fn()
                stop.record()
                stop.synchronize()
                times.append(start.elapsed_time(stop))
            else:
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)

    return measure


def _fbgemm(
    codec: Codec, x: torch.Tensor, width: int, measure
) -> tuple[float | None, float | None]:
    """(encode ms, decode ms) of fbgemm's codec for ``x`` as rows of ``width``, or None."""
    if codec.name not in FBGEMM_TYPES:
        return None, None
    try:
        from fbgemm_gpu.quantize_comm import QuantizationContext, QuantizedCommCodec
        from fbgemm_gpu.split_embedding_configs import SparseType

        fb = QuantizedCommCodec(SparseType[FBGEMM_TYPES[codec.name]], row_dim=width)
        ctx = QuantizationContext(row_dim=width)
        flat = x.reshape(-1)
        encoded = fb.encode(flat, ctx)
        fb.decode(encoded, ctx)
        return measure(lambda: fb.encode(flat, ctx)), measure(lambda: fb.decode(encoded, ctx))
    except Exception as error:  # fbgemm lacks some CPU ops; report n/a rather than fail
        print(
            f"# fbgemm {codec.name}: unavailable ({type(error).__name__}: {str(error)[:80]})",
            file=sys.stderr,
        )
        return None, None


class Shape(TypedDict):
    """The exchange measured: ``batch`` rows of ``tables`` x ``width`` columns."""

    batch: int
    tables: int
    width: int
    ranks: tuple[int, ...]


def run(
    *, batch: int, tables: int, width: int, ranks: tuple[int, ...], smoke: bool
) -> tuple[list[Row], float]:
    device = torch.device("cpu" if smoke or not torch.cuda.is_available() else "cuda")
    measure = _timer(device, warmup=0 if smoke else 3, iters=1 if smoke else 20)
    cols = tables * width
    blocks = [(t * width, width) for t in range(tables)]
    x = torch.randn(batch, cols, device=device)
    # Copy bandwidth: a buffer moving as many bytes as the fp32 input (read + write).
    src = torch.empty(batch * cols * 4, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    copy_gbps = 2 * src.numel() / measure(lambda: dst.copy_(src)) / 1e6
    rows: list[Row] = []
    for world in ranks:
        layout = ExchangeLayout.from_row_splits([batch // world] * world, blocks, num_cols=cols)
        segments = layout.segments
        for codec in CODECS.values():
            wire = layout.total_bytes(codec)
            traffic = x.numel() * 4 + wire
            payload, _ = pack_triton(x, segments, codec)
            expected, _ = pack_reference(x, segments, codec)
            out = unpack_reduce_triton(payload, segments, codec, batch, cols)
            ref_out = unpack_reduce_reference(expected, segments, codec, batch, cols)
            diff = float((out - ref_out).abs().max()) if out.numel() else 0.0
            bytes_match = torch.equal(payload, expected)
            fb_encode, fb_decode = _fbgemm(codec, x, width, measure)
            unpack_args = (payload, segments, codec, batch, cols)
            for op, fused, unfused, fb_ms in (
                (
                    "pack",
                    partial(pack_triton, x, segments, codec),
                    partial(pack_reference, x, segments, codec),
                    fb_encode,
                ),
                (
                    "unpack",
                    partial(unpack_reduce_triton, *unpack_args),
                    partial(unpack_reduce_reference, *unpack_args),
                    fb_decode,
                ),
            ):
                fused_ms, torch_ms = measure(fused), measure(unfused)
                gbps = traffic / fused_ms / 1e6
                rows.append(
                    Row(
                        ranks=world,
                        op=op,
                        format=codec.name,
                        triton_ms=fused_ms,
                        gbps=gbps,
                        copy_fraction=gbps / copy_gbps,
                        torch_ms=torch_ms,
                        speedup_vs_torch=torch_ms / fused_ms,
                        fbgemm_ms=fb_ms,
                        max_abs_diff=diff,
                        bytes_match=bytes_match,
                    )
                )
    return rows, copy_gbps


def format_table(rows: list[Row], copy_gbps: float, device: str) -> str:
    head = f"device: {device}; device-to-device copy: {copy_gbps:.1f} GB/s (read + write)\n"
    cols = (
        "ranks",
        "op",
        "format",
        "triton ms",
        "GB/s",
        "% copy",
        "torch ms",
        "x torch",
        "fbgemm ms",
        "max |diff|",
        "bytes = ref",
    )
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        fb = f"{r.fbgemm_ms:.3f}" if r.fbgemm_ms is not None else "n/a"
        lines.append(
            f"| {r.ranks} | {r.op} | {r.format} | {r.triton_ms:.3f} | {r.gbps:.1f} | "
            f"{100 * r.copy_fraction:.0f}% | {r.torch_ms:.3f} | {r.speedup_vs_torch:.2f} | {fb} | "
            f"{r.max_abs_diff:.3g} | {'yes' if r.bytes_match else 'NO'} |"
        )
    return head + "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--smoke", action="store_true", help="tiny shapes in the Triton interpreter on CPU"
    )
    parser.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    parser.add_argument(
        "--check-cases",
        type=int,
        default=None,
        help="randomised correctness cases first (default: 200 on a GPU, 3 with --smoke)",
    )
    args = parser.parse_args(argv)
    num_checks = args.check_cases if args.check_cases is not None else (3 if args.smoke else 200)
    if num_checks < 0:
        parser.error(f"--check-cases must be >= 0, got {num_checks}")
    if args.smoke:
        shape = Shape(batch=8, tables=2, width=8, ranks=(2, 4))
    else:
        if not torch.cuda.is_available():
            print(
                "no CUDA device: run with --smoke for the CPU interpreter check", file=sys.stderr
            )
            return 2
        shape = Shape(batch=65_536, tables=26, width=128, ranks=(8, 64))
    device = "cpu (Triton interpreter)" if args.smoke else torch.cuda.get_device_name()
    checks = (
        selfcheck.run_checks(
            torch.device("cpu" if args.smoke else "cuda"),
            num_cases=num_checks,
            wide=not args.smoke,
        )
        if num_checks
        else []
    )
    if checks:
        print(f"correctness: {num_checks} randomised cases per op against the CPU reference")
        print(selfcheck.summary(checks) + "\n")
    rows, copy_gbps = run(**shape, smoke=args.smoke)
    print(
        f"shape: B={shape['batch']}, {shape['tables']} x {shape['width']} columns, ranks "
        f"{shape['ranks']}"
    )
    print(format_table(rows, copy_gbps, device))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "device": device,
                    "shape": shape,
                    "copy_gbps": copy_gbps,
                    "rows": [asdict(r) for r in rows],
                    "checks": {
                        "cases": len(checks),
                        "failed": [asdict(c) for c in checks if not c.ok],
                    },
                },
                f,
                indent=1,
            )
    return 0 if all(c.ok for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
