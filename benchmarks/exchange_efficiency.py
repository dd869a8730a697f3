"""Each cluster type's cross-host exchange measured against the link's own limit.

On the emulated cluster (2 hosts x 2 ranks by default, the emulation's 800 Mbit/s veth):

1. the link: one plain TCP stream from host 0 to host 1 over the shaped veth (the line
   rate a transfer actually gets) and one inside host 0 over loopback
   (:func:`lightning_embark.emulation.measure_link`);
2. the exchanges: the engine's own transport (:func:`lightning_embark.exchange.make_exchange`
   on the world group: :class:`FlatAllToAll` or :class:`HierarchicalAllToAll` with its real
   host and same-local-rank groups), moving encoded rows as a cluster's rows phase does,
   for a sweep of per-rank payloads. ``rb``: every peer gets the same rows (one pooled
   partial per sample and request); ``ub``: peers get unequal rows (unique counts differ
   by owner: 0.5x and 1.5x the mean, alternately). The wire sets the bytes per row of
   width 128 (``fp32`` 512, ``bf16`` 256): the sweep's size is the fp32 payload per rank,
   so a compressed wire moves fewer bytes for the same rows. Each rank passes the receive
   counts, as the engine's rows phase does (known from the headers).

Efficiency (the same formula as ``embark-bench --profile``,
:func:`lightning_embark.harness.efficiency`)::

    link_bytes = max over hosts h of sum over ranks r on h of inter_bytes(r)
    efficiency = (link_bytes / line_rate) / seconds

``inter_bytes(r)``: the bytes rank ``r`` sends to other hosts in one exchange, counted by
:class:`~lightning_embark.accounting.CommCounter` around the real call (hierarchical: its
cross-host stage). Each emulated host has one veth, shaped to the rate in each direction
and shared by all its ranks, so ``link_bytes`` is the busiest host's egress per
direction (its ingress is the same for these symmetric exchanges). ``line_rate`` is the
measured TCP rate over the shaped veth (``eff``) or the rate ``tc`` applied
(``eff nominal``). ``seconds``: the median over repetitions of the slowest rank's wall time
for one exchange, every rank starting after a barrier. Intra-host bytes are not in the
numerator (loopback is ~18x faster); the JSON keeps them with the loopback rate.

    python benchmarks/exchange_efficiency.py [--hosts 2] [--ranks-per-host 2] \\
        [--rate-mbit 800] [--sizes-kb 64,256,1024,4096,8192] [--clusters rb,ub] \\
        [--exchanges flat,hier] [--wires fp32,bf16] [--reps 5] [--out r.json]

Progress goes to stderr; the table to stdout. Needs root for the namespaces; without
them it runs on loopback and says so (no efficiency then: nothing is shaped).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightning_embark.errors import ConfigError
from lightning_embark.harness import efficiency, link_bytes
from lightning_embark.lists import list_items, parse_list

WIDTH = 128
WIRES = ("fp32", "bf16", "fp16", "fp8", "int8")
UB_SKEW = (0.5, 1.5)


@dataclass(frozen=True)
class Case:
    """One measured configuration."""

    cluster: str
    exchange: str
    wire: str
    size_kb: int


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--ranks-per-host", type=int, default=2)
    parser.add_argument("--rate-mbit", type=float, default=None, help="default: emulation's")
    parser.add_argument("--sizes-kb", default="64,256,1024,4096,8192", help="fp32 KB per rank")
    parser.add_argument("--clusters", default="rb,ub")
    parser.add_argument("--exchanges", default="flat,hier")
    parser.add_argument("--wires", default="fp32,bf16")
    parser.add_argument("--reps", type=int, default=5, help="timed exchanges per case")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--link-seconds", type=float, default=2.0, help="each TCP probe")
    parser.add_argument("--loopback", action="store_true", help="no emulation")
    parser.add_argument("--out", type=Path, default=None, help="write the JSON here")
    parser.add_argument("--worker-out", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for name in ("clusters", "exchanges", "wires"):
        setattr(args, name, list_items(getattr(args, name)))
    try:
        args.sizes_kb = list(parse_list(args.sizes_kb, int, what="--sizes-kb"))
    except ConfigError as error:
        parser.error(str(error))
    bad = [w for w in args.wires if w not in WIRES] + [
        c for c in args.clusters if c not in ("rb", "ub")
    ]
    bad += [e for e in args.exchanges if e not in ("flat", "hier")]
    if bad or not args.sizes_kb or min(args.sizes_kb) < 1 or args.reps < 1:
        parser.error(f"bad option values {bad or args.sizes_kb}")
    return args


def cases(args: argparse.Namespace) -> list[Case]:
    """Every configuration, exchange kind outermost (its groups are made once)."""
    return [
        Case(cluster, exchange, wire, size)
        for exchange in args.exchanges
        for cluster in args.clusters
        for wire in args.wires
        for size in args.sizes_kb
    ]


def send_rows(cluster: str, size_kb: int, src: int, world: int) -> list[int]:
    """Rows ``src`` sends to each destination: ``size_kb`` of fp32 rows of width
    :data:`WIDTH` in all, equal per peer (``rb``) or alternately 0.5x and 1.5x the mean
    (``ub``, an even world)."""
    mean = max(1, size_kb * 1024 // (4 * WIDTH) // world)
    if cluster == "rb":
        return [mean] * world
    return [max(1, round(mean * UB_SKEW[(src + dst) % 2])) for dst in range(world)]


def row_result(
    case: Case,
    *,
    seconds: float,
    inter_by_rank: list[int],
    intra_by_rank: list[int],
    sent_by_rank: list[int],
    ranks_per_host: int,
    line_mb_s: float | None,
    nominal_mb_s: float | None,
    loopback_mb_s: float | None,
) -> dict[str, Any]:
    """One table row: bytes, time, achieved rate and efficiency (module docstring)."""
    link = link_bytes(inter_by_rank, ranks_per_host)
    return {
        "cluster": case.cluster,
        "exchange": case.exchange,
        "wire": case.wire,
        "fp32_kb_per_rank": case.size_kb,
        "wire_mb_per_rank": max(sent_by_rank) / 1e6,
        "inter_mb_per_rank": max(inter_by_rank) / 1e6,
        "intra_mb_per_rank": max(intra_by_rank) / 1e6,
        "link_mb": link / 1e6,
        "ms": 1000 * seconds,
        "achieved_mb_s": link / seconds / 1e6 if seconds else None,
        "line_mb_s": line_mb_s,
        "efficiency": efficiency(link, (line_mb_s or 0) * 1e6, seconds),
        "nominal_mb_s": nominal_mb_s,
        "efficiency_nominal": efficiency(link, (nominal_mb_s or 0) * 1e6, seconds),
        "loopback_mb_s": loopback_mb_s,
    }


def format_table(rows: list[dict[str, Any]]) -> str:
    """The rows as a fixed-width table (``-`` where there is no rate: loopback)."""
    header = (
        f"{'cluster':<8}{'exch':<6}{'wire':<6}{'MB/rank':>9}{'link MB':>9}{'ms':>9}"
        f"{'MB/s':>8}{'line MB/s':>10}{'eff':>6}{'eff nom':>8}"
    )
    lines = [header, "-" * len(header)]

    def num(value: float | None, spec: str) -> str:
        return "-" if value is None else format(value, spec)

    for r in rows:
        lines.append(
            f"{r['cluster']:<8}{r['exchange']:<6}{r['wire']:<6}{r['wire_mb_per_rank']:>9.3f}"
            f"{r['link_mb']:>9.3f}{r['ms']:>9.1f}{num(r['achieved_mb_s'], '.1f'):>8}"
            f"{num(r['line_mb_s'], '.1f'):>10}{num(r['efficiency'], '.2f'):>6}"
            f"{num(r['efficiency_nominal'], '.2f'):>8}"
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------- worker
def worker(args: argparse.Namespace) -> int:
    """One rank: every case through the engine's exchange; rank 0 writes the raw figures."""
    import torch
    import torch.distributed as dist

    from lightning_embark.accounting import CommCounter, counting_collectives
    from lightning_embark.exchange import make_exchange
    from lightning_embark.topology import ranks_per_host_from_env
    from lightning_embark.wire import codec_by_name

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    local = ranks_per_host_from_env(world)
    exchanges = {
        kind: make_exchange(hierarchical=kind == "hier", ranks_per_host=local)
        for kind in args.exchanges
    }
    raw = []
    todo = cases(args)
    for index, case in enumerate(todo, start=1):
        row_bytes = codec_by_name(case.wire).row_bytes(WIDTH)
        counts = send_rows(case.cluster, case.size_kb, rank, world)
        recv = [send_rows(case.cluster, case.size_kb, src, world)[rank] for src in range(world)]
        send = torch.randint(0, 255, (sum(counts), row_bytes), dtype=torch.uint8)
        exchange = exchanges[case.exchange]
        counter = CommCounter(rank=rank, ranks_per_host=local)
        with counting_collectives(counter):
            exchange(send, counts, recv)
        snap = counter.snapshot()
        times = []
        for rep in range(args.warmup + args.reps):
            dist.barrier()
            start = time.perf_counter()
            exchange(send, counts, recv)
            if rep >= args.warmup:
                times.append(time.perf_counter() - start)
        figures = torch.tensor(
            [snap.inter_host_bytes, snap.intra_host_bytes, send.numel()], dtype=torch.float64
        )
        gathered = [torch.zeros_like(figures) for _ in range(world)]
        dist.all_gather(gathered, figures)
        slowest = torch.tensor(times, dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        seconds = statistics.median(slowest.tolist())
        if rank == 0:
            raw.append(
                {
                    "case": vars(case),
                    "seconds": seconds,
                    "inter": [int(g[0]) for g in gathered],
                    "intra": [int(g[1]) for g in gathered],
                    "sent": [int(g[2]) for g in gathered],
                }
            )
            print(
                f"[exchange-efficiency] {index}/{len(todo)} {case.cluster} {case.exchange} "
                f"{case.wire} {case.size_kb} KB: {1000 * seconds:.1f} ms",
                file=sys.stderr,
                flush=True,
            )
    if rank == 0:
        assert args.worker_out is not None
        args.worker_out.write_text(json.dumps({"ranks_per_host": local, "raw": raw}))
    dist.barrier()
    dist.destroy_process_group()
    return 0


# --------------------------------------------------------------------------- launcher
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker_out is not None and "RANK" in os.environ:
        return worker(args)
    from lightning_embark.emulation import (
        QUIET_RANK_ENV,
        EmulatedHosts,
        EmulationConfig,
        measure_link,
    )

    rate = {"rate_mbit": args.rate_mbit} if args.rate_mbit is not None else {}
    config = EmulationConfig(num_hosts=args.hosts, ranks_per_host=args.ranks_per_host, **rate)
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="exchange-efficiency-") as tmp:
        raw_path = Path(tmp) / "raw.json"
        with EmulatedHosts(config, force_loopback=args.loopback) as cluster:
            print(f"[exchange-efficiency] {cluster.describe()}", file=sys.stderr, flush=True)
            links = measure_link(cluster, seconds=args.link_seconds)
            print(f"[exchange-efficiency] link: {links.summary()}", file=sys.stderr, flush=True)
            passed = list(argv if argv is not None else sys.argv[1:])
            code = cluster.run(
                [str(Path(__file__).resolve()), *passed, "--worker-out", str(raw_path)],
                env=QUIET_RANK_ENV,
            )
            if code != 0:
                print(f"exchange_efficiency: the ranks failed ({code})", file=sys.stderr)
                return code
            mode, describe = cluster.mode, cluster.describe()
        worker_result = json.loads(raw_path.read_text())
    netns = mode == "netns"
    line = links.inter_host_mb_s if netns else None
    nominal = config.rate_mbit / 8 if netns and config.rate_mbit else None
    rows = [
        row_result(
            Case(**r["case"]),
            seconds=r["seconds"],
            inter_by_rank=r["inter"],
            intra_by_rank=r["intra"],
            sent_by_rank=r["sent"],
            ranks_per_host=worker_result["ranks_per_host"],
            line_mb_s=line,
            nominal_mb_s=nominal,
            loopback_mb_s=links.intra_host_mb_s,
        )
        for r in worker_result["raw"]
    ]
    print(describe)
    print(f"link ({args.link_seconds:g} s TCP probes): {links.summary()}")
    print(format_table(rows))
    print(f"({time.time() - started:.0f} s)", file=sys.stderr)
    if args.out is not None:
        result = {
            "cluster": {"mode": mode, "description": describe, **vars(config)},
            "link": {
                "inter_host_mb_s": links.inter_host_mb_s,
                "intra_host_mb_s": links.intra_host_mb_s,
                "nominal_mb_s": nominal,
                "probe_seconds": links.seconds,
            },
            "width": WIDTH,
            "reps": args.reps,
            "rows": rows,
        }
        args.out.write_text(json.dumps(result, indent=2))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
