"""The dense gradients' all-reduce on gloo: DDP's flat ring against the hierarchical one.

Four gloo ranks as 2 hosts x 2 ranks on loopback (no shaped link: what is timed is what
the collectives cost the ranks' CPUs, the part a faster link does not remove). Each
round times, in turn and in an order that alternates between rounds:

- ``flat``: one ``all_reduce`` over every rank (DDP's stock exchange);
- ``hier``: :func:`lightning_embark.sharding.hierarchical_allreduce` (embark's default
  dense exchange): a reduce-scatter inside the host, the slice's all-reduce across
  hosts, an all-gather inside the host: a third fewer bytes across hosts, in three
  phases.

A round's time is the slowest rank's, every rank starting after a barrier, the mean of
``--calls`` calls. The table gives each exchange's median over the rounds and its paired
ratio to ``flat`` of the same round, with a 95% Wilcoxon interval
(:func:`lightning_embark.harness.ratio_interval`)::

    python benchmarks/dense_exchange.py [--sizes 70000,2090000] [--rounds 7] [--calls 10]

``--sizes`` are fp32 elements: 70,000 is about MLPerf's light dense part, 2,090,000 the
over-arch of T510's (dot interaction over 510 tables, 16 units).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

import torch
import torch.distributed as dist

from lightning_embark.harness import format_interval, ratio_interval
from lightning_embark.lists import parse_list
from lightning_embark.plan import Compression
from lightning_embark.sharding import dense_allreduce_state, hierarchical_allreduce
from lightning_embark.testing import rank_context, run_gloo_ranks

WORLD, RANKS_PER_HOST = 4, 2
EXCHANGES = ("flat", "hier")


def _rank(rank: int, world: int, sizes: list[int], rounds: int, calls: int, out: Any) -> None:
    torch.set_num_threads(1)
    state = dense_allreduce_state(ranks_per_host=RANKS_PER_HOST, compression=Compression.FP32)
    times: dict[tuple[int, str], list[float]] = {}
    for size in sizes:
        grad = torch.randn(size)
        runs = {
            "flat": lambda grad=grad: dist.all_reduce(grad.clone()),
            "hier": lambda grad=grad: hierarchical_allreduce(grad, state),
        }
        for i in range(rounds + 1):  # round 0 warms up
            order = EXCHANGES if i % 2 else EXCHANGES[::-1]
            for name in order:
                dist.barrier()
                start = time.perf_counter()
                for _ in range(calls):
                    runs[name]()
                elapsed = torch.tensor([(time.perf_counter() - start) / calls])
                dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
                if i:
                    times.setdefault((size, name), []).append(float(elapsed))
    if rank == 0:
        out.put(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="70000,2090000", help="fp32 elements, comma list")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=10)
    args = parser.parse_args(argv)
    sizes = list(parse_list(args.sizes, int, what="--sizes"))
    out = rank_context().Queue()
    print(f"timing {len(EXCHANGES)} exchanges x {len(sizes)} sizes ...", file=sys.stderr)
    run_gloo_ranks(_rank, WORLD, sizes, args.rounds, args.calls, out)
    times = out.get()
    print(f"{'elements':>10} {'exchange':<9} {'median ms':>9}  x flat [95%]")
    for size in sizes:
        flat = times[(size, "flat")]
        for name in EXCHANGES:
            mine = times[(size, name)]
            ratios = [m / f for m, f in zip(mine, flat, strict=True)]
            ratio = format_interval(ratio_interval(ratios))
            print(f"{size:>10,} {name:<9} {1000 * statistics.median(mine):>9.1f}  {ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
