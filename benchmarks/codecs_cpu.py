"""Throughput of the engine's wire codecs on the CPU (the reference ops, one thread).

For every codec it prints the fp32 GB/s of encoding an all-finite block (the fast path:
one sum proves every value finite), of encoding the same block with one inf in it (the
non-finite policy's extra passes), and of decoding; medians over ``--repeats``. The
cost model's ``codec_bandwidth`` / ``cast_codec_bandwidth`` come from the same codecs
timed by ``embark-calibrate`` with all ranks at once.

    python benchmarks/codecs_cpu.py [--rows 8192] [--width 128] [--repeats 15]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial

import torch

from lightning_embark.wire import CODECS


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=8192)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    if args.rows < 1 or args.width < 1 or args.repeats < 1:
        parser.error("--rows, --width and --repeats must be positive")
    torch.set_num_threads(args.threads)
    x = torch.randn(args.rows, args.width, generator=torch.Generator().manual_seed(0))
    with_inf = x.clone()
    with_inf[args.rows // 2, 0] = torch.inf
    gb = x.numel() * 4 / 1e9
    print(
        f"{args.rows} x {args.width} fp32 ({gb * 1e3:.1f} MB), {args.threads} thread(s), median "
        f"of {args.repeats}\n"
    )
    print("| codec | encode GB/s (finite) | encode GB/s (one inf) | fast path | decode GB/s |")
    print("|---|---:|---:|---:|---:|")
    for name, codec in CODECS.items():
        fast = median_seconds(partial(codec.encode, x), args.repeats)
        policy = median_seconds(partial(codec.encode, with_inf), args.repeats)
        payload = codec.encode(x).payload
        decode = median_seconds(partial(codec.decode, payload, args.width), args.repeats)
        print(
            f"| {name} | {gb / fast:.2f} | {gb / policy:.2f} | {policy / fast:.1f}x | "
            f"{gb / decode:.2f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
