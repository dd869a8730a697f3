"""``embark-bench``: strategies side by side on the same model, data and emulated cluster."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from lightning_embark.emulation import DEFAULT_RATE_MBIT
from lightning_embark.errors import EmbarkError
from lightning_embark.harness import (
    BenchConfig,
    format_dispatch_run,
    format_profile_table,
    format_table,
    run_benchmark,
)
from lightning_embark.lists import list_items


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="embark-bench",
        description="Run recommendation-model training strategies side by side on an emulated "
        "multi-host cluster and report step time, bytes per step (intra/inter-host) and memory. "
        "Each strategy's start and rank 0's progress over its steps are shown as it runs.",
    )
    parser.add_argument("--model", required=True, help="model spec JSON or preset name")
    parser.add_argument("--max-rows", type=int, default=None, help="cap rows per table")
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--ranks-per-host", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=512, help="per-rank batch size")
    parser.add_argument("--steps", type=int, default=20, help="measured steps per strategy")
    parser.add_argument("--warmup", type=int, default=3, help="unmeasured steps first")
    parser.add_argument("--strategies", default="torchrec,torchrec-fp16", help="comma-separated")
    parser.add_argument(
        "--rate-mbit",
        type=float,
        default=None,
        help=f"inter-host link rate (default: the emulation's, {DEFAULT_RATE_MBIT:g} Mbit/s)",
    )
    parser.add_argument("--delay-ms", type=float, default=0.0, help="added inter-host latency")
    parser.add_argument("--interaction", choices=("dcn", "dot"), default="dcn")
    parser.add_argument("--dense-arch", default="512,256")
    parser.add_argument("--over-arch", default="1024,1024,512,256,1")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--loopback",
        action="store_true",
        help="no emulation: plain loopback, no shaped link (the JSON's rate_mbit is null)",
    )
    parser.add_argument(
        "--plan", default=None, help="plan JSON for the embark strategy (default: automatic)"
    )
    parser.add_argument(
        "--allow",
        default="",
        help="compressions the automatic embark plan may use, e.g. fp16,bf16,fp8,int8 (default: "
        "lossless only)",
    )
    parser.add_argument(
        "--dense-compression",
        choices=("fp32", "bf16", "fp16"),
        default=None,
        help="wire format of every strategy's dense-gradient all-reduce, torchrec's DDP "
        "included (default: bf16 when --allow names bf16, else fp32, for every strategy)",
    )
    parser.add_argument(
        "--dense-exchange",
        choices=("flat", "hierarchical"),
        default=None,
        help="how every strategy's dense gradients cross ranks: flat (one all-reduce over "
        "every rank) or hierarchical (reduced inside each host first, embark's default; "
        "torchrec's DDP gets the same hook) (default: each strategy's own)",
    )
    parser.add_argument(
        "--towers",
        default="auto",
        help="embark-towers, torchrec-towers: a tower count, auto (per module, the cost "
        "model's choice of flat or H, 2H or LH towers) or a towers.json (default: auto)",
    )
    parser.add_argument(
        "--tower-module",
        default="identity",
        help="embark-towers, torchrec-towers: comma list of identity, projection, dcn, dot; one "
        "embark-towers run per module (reported as embark-towers:<module>), one "
        "torchrec-towers run per compressing one (torchrec cannot shard identity towers)",
    )
    parser.add_argument(
        "--tower-ratio",
        type=float,
        default=None,
        help="embark-towers, torchrec-towers: D_t / O_t of the compressing tower modules (e.g. 4)",
    )
    parser.add_argument(
        "--tower-compression",
        default="fp32",
        help="embark-towers: wire format of the tower outputs and their gradients",
    )
    parser.add_argument(
        "--pipeline",
        action=argparse.BooleanOptionalAction,
        default=BenchConfig.pipeline,
        help="every strategy trains through its input pipeline, as its users run it: torchrec's "
        "TrainPipelineSparseDist, embark's IDs sent a step ahead (EmbarkStrategy's default); "
        "--no-pipeline runs every strategy without one",
    )
    parser.add_argument(
        "--overlap",
        action=argparse.BooleanOptionalAction,
        default=BenchConfig.overlap,
        help="embark runs issue each cluster's exchanges from a worker thread, overlapping "
        "the next cluster's lookups (EmbarkStrategy's default); --no-overlap runs them in turn",
    )
    parser.add_argument(
        "--unshaped",
        action="store_true",
        help="leave the emulated hosts' links unshaped: the same step with no link cost",
    )
    parser.add_argument(
        "--exposed",
        action="store_true",
        help="run every strategy on the shaped link and again unshaped, back to back, and "
        "report its exposed communication (shaped step minus unshaped step)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="embark runs: time and inter-host bytes of each cluster's exchanges per phase "
        "(header, ids, rows, grads, sync), and their efficiency against the applied link rate; "
        "every run: what a GPU would see of one warm-up step (ATen ops, host syncs by call "
        "site, collectives)",
    )
    parser.add_argument("--out", type=Path, default=None, help="write the result JSON here")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = BenchConfig(
            model=args.model,
            max_rows=args.max_rows,
            num_hosts=args.hosts,
            ranks_per_host=args.ranks_per_host,
            batch_size=args.batch_size,
            steps=args.steps,
            warmup=args.warmup,
            strategies=tuple(list_items(args.strategies)),
            rate_mbit=args.rate_mbit,
            delay_ms=args.delay_ms,
            interaction=args.interaction,
            dense_arch=args.dense_arch,
            over_arch=args.over_arch,
            seed=args.seed,
            loopback=args.loopback,
            plan=args.plan,
            allow=tuple(list_items(args.allow)),
            dense_compression=args.dense_compression,
            dense_exchange=args.dense_exchange,
            towers=args.towers,
            tower_modules=tuple(list_items(args.tower_module)),
            tower_ratio=args.tower_ratio,
            tower_compression=args.tower_compression,
            pipeline=args.pipeline,
            overlap=args.overlap,
            unshaped=args.unshaped,
            exposed=args.exposed,
            profile=args.profile,
        )
        result = run_benchmark(config)
    except EmbarkError as error:
        print(f"embark-bench: error: {error}", file=sys.stderr)
        return 2
    print(result["config"]["spec"])
    print(result["config"]["cluster"]["description"])
    print(format_table(result["runs"]))
    for run in result["runs"]:
        if "profile" in run:
            print()
            print(
                format_profile_table(
                    run["strategy"], run["profile"], result["config"]["rate_mbit"]
                )
            )
        if run.get("dispatch"):
            print()
            print(format_dispatch_run(run["strategy"], run["dispatch"]))
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
