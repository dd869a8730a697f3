"""``embark-tune``: refine the greedy plan with an Optuna study of short measured runs.

    embark-tune --model demo-small --hosts 2 --ranks-per-host 2 --allow bf16,fp16 \\
        --trials 20 --timeout 900 --out best-plan.json --plots tune-plots

Run as is, it brings up the emulated cluster and launches itself on every host (the
ranks restart after a crash or hang; the study resumes from its storage). Launched by
torchrun or SLURM on a real cluster (``WORLD_SIZE`` is set), it is one rank of the
study: rank 0 holds the study, every rank measures.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from lightning_embark.cli._args import rate_mbit
from lightning_embark.errors import EmbarkError
from lightning_embark.lists import list_items

if TYPE_CHECKING:
    from lightning_embark.search import TuneConfig


def build_parser() -> argparse.ArgumentParser:
    from lightning_embark.search import DEFAULT_STORAGE

    parser = argparse.ArgumentParser(
        prog="embark-tune",
        description=__doc__.splitlines()[0],
        epilog="Browse a study with `optuna-dashboard STORAGE`; refit the cost model from it "
        "with `embark-calibrate --from-study STORAGE`.",
    )
    parser.add_argument("--model", required=True, help="model spec JSON or preset name")
    parser.add_argument("--max-rows", type=int, default=None, help="cap rows per table")
    parser.add_argument("--stats", default=None, help="statistics JSON from embark-stats")
    parser.add_argument("--hosts", type=int, default=2, help="hosts (default: 2)")
    parser.add_argument("--ranks-per-host", type=int, default=2, help="ranks per host")
    parser.add_argument("--batch-size", type=int, default=512, help="per-rank batch size")
    parser.add_argument(
        "--allow", default="", help="compressions a candidate may use, e.g. bf16,fp16,fp8,int8"
    )
    parser.add_argument(
        "--towers",
        action="store_true",
        help="also search DMT towers as towers=auto chooses them: 0, H, 2H or L*H of them, "
        "identity (the model unchanged) or the compressing settings shown to keep accuracy "
        "(the run trains the model over them)",
    )
    parser.add_argument(
        "--topology",
        default="emulated",
        help="calibration preset or JSON the planner and the screen use (default: emulated)",
    )
    parser.add_argument("--trials", type=int, default=20, help="trials the study should hold")
    parser.add_argument(
        "--timeout", type=float, default=None, help="seconds for the search phase (default: none)"
    )
    parser.add_argument("--steps", type=int, default=8, help="measured steps per trial")
    parser.add_argument("--warmup", type=int, default=2, help="unmeasured steps per trial first")
    parser.add_argument(
        "--trial-timeout",
        type=float,
        default=120.0,
        help="seconds after which a trial counts as hung (default: 120)",
    )
    parser.add_argument(
        "--storage",
        default=DEFAULT_STORAGE,
        help=f"Optuna storage URL or journal file (*.log) (default: {DEFAULT_STORAGE})",
    )
    parser.add_argument("--study-name", default="embark-tune", help="study name in the storage")
    parser.add_argument("--top-k", type=int, default=3, help="candidates re-measured at the end")
    parser.add_argument("--pairs", type=int, default=7, help="paired re-measurement rounds")
    parser.add_argument(
        "--pruner", choices=("wilcoxon", "median", "none"), default="wilcoxon", help="step pruner"
    )
    parser.add_argument(
        "--screen-margin",
        type=float,
        default=1.5,
        help="prune unrun candidates estimated above this factor of the best (default: 1.5)",
    )
    parser.add_argument("--seed", type=int, default=0, help="data, model and sampler seed")
    parser.add_argument("--interaction", choices=("dcn", "dot"), default="dcn")
    parser.add_argument("--dense-arch", default="512,256", help="bottom MLP hidden sizes")
    parser.add_argument("--over-arch", default="1024,1024,512,256,1", help="top MLP sizes")
    parser.add_argument(
        "--dense-compression",
        choices=("fp32", "bf16", "fp16"),
        default=None,
        help="dense-gradient wire format of every run (default: bf16 if --allow names it)",
    )
    parser.add_argument(
        "--rate-mbit", type=rate_mbit, default=None, help="emulated inter-host link rate"
    )
    parser.add_argument("--delay-ms", type=float, default=0.0, help="emulated inter-host latency")
    parser.add_argument("--loopback", action="store_true", help="no emulation: plain loopback")
    parser.add_argument("--out", default="best-plan.json", help="best plan file to write")
    parser.add_argument("--plots", default=None, help="folder for PNG plots")
    parser.add_argument(
        "--work-dir", default=None, help="run folder (default: next to --out, *.tune)"
    )
    parser.add_argument("--max-restarts", type=int, default=10, help="rank restarts allowed")
    parser.add_argument("--json", type=Path, default=None, help="write the result JSON here")
    return parser


def config_from_args(args: argparse.Namespace) -> TuneConfig:
    from lightning_embark.search import TuneConfig

    return TuneConfig(
        model=args.model,
        max_rows=args.max_rows,
        stats=args.stats,
        num_hosts=args.hosts,
        ranks_per_host=args.ranks_per_host,
        batch_size=args.batch_size,
        allow=tuple(list_items(args.allow)),
        towers=args.towers,
        topology=args.topology,
        trials=args.trials,
        timeout_s=args.timeout,
        steps=args.steps,
        warmup=args.warmup,
        trial_timeout_s=args.trial_timeout,
        storage=args.storage,
        study_name=args.study_name,
        top_k=args.top_k,
        pairs=args.pairs,
        pruner=args.pruner,
        screen_margin=args.screen_margin,
        seed=args.seed,
        interaction=args.interaction,
        dense_arch=args.dense_arch,
        over_arch=args.over_arch,
        dense_compression=args.dense_compression,
        rate_mbit=args.rate_mbit,
        delay_ms=args.delay_ms,
        loopback=args.loopback,
        out=args.out,
        plots=args.plots,
        work_dir=args.work_dir,
        max_restarts=args.max_restarts,
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from lightning_embark.search import format_result, run_ranks, tune

    try:
        config = config_from_args(args)
        if "WORLD_SIZE" in os.environ:  # one rank of a launched study
            return run_ranks(config)
        result = tune(config)
    except EmbarkError as error:
        print(f"embark-tune: error: {error}", file=sys.stderr)
        return 2
    print(format_result(result))
    if args.json is not None:
        args.json.write_text(json.dumps(result.to_dict(), indent=2))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
