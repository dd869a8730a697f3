"""``python -m lightning_embark.gpucheck [--device cuda|cpu] [--out gpucheck.json] ...``"""

from __future__ import annotations

import argparse
import sys

from lightning_embark.errors import ConfigError
from lightning_embark.gpucheck import CheckConfig, format_report, run_check, write_report
from lightning_embark.gpucheck._check import DEFAULTS
from lightning_embark.lists import parse_list


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m lightning_embark.gpucheck",
        description="The engine and the kernels on this machine's GPU (or CPU) against "
        "references, what a GPU sees of a step (ATen ops, host syncs, collectives) and step "
        "timings; writes one JSON file. The kernels run compiled on cuda and in Triton's "
        "interpreter on cpu (set up by the check).",
    )
    defaults = CheckConfig.__dataclass_fields__
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument(
        "--worlds",
        default="1,2",
        help="rank counts of the engine check, comma-separated (a CUDA world needs a GPU "
        "per rank; others are skipped and listed)",
    )
    for name, help_text in (
        ("batch", "samples per rank of the exact and the counted step"),
        ("timing_batch", "samples per rank of the timed steps"),
        ("steps", "timed steps per cluster type and kernel backend"),
        ("warmup", "untimed steps before them"),
        ("kernel_cases", "randomised cases of the kernels' self-check (four ops each)"),
        ("seed", "seed of the scenario and the self-check"),
    ):
        per_device = DEFAULTS["cuda"].get(name)
        parser.add_argument(
            f"--{name.replace('_', '-')}",
            type=int,
            default=defaults[name].default,
            help=f"{help_text} (default: "
            + (
                f"{per_device} on cuda, {DEFAULTS['cpu'][name]} on cpu)"
                if per_device is not None
                else "%(default)s)"
            ),
        )
    parser.add_argument(
        "--store",
        default="torch",
        choices=("torch", "fbgemm"),
        help="the engine's embedding store (default: torch, which needs no fbgemm-gpu; "
        "fbgemm: its CPU kernels, --device cpu only)",
    )
    parser.add_argument("--out", default="gpucheck.json", help="the JSON report's path")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        config = CheckConfig(
            device=args.device,
            worlds=parse_list(args.worlds, int, what="--worlds"),
            batch=args.batch,
            timing_batch=args.timing_batch,
            steps=args.steps,
            warmup=args.warmup,
            kernel_cases=args.kernel_cases,
            store=args.store,
            seed=args.seed,
        )
    except (ConfigError, ValueError) as error:
        parser.error(str(error))
    report = run_check(config)
    write_report(report, args.out)
    print(format_report(report))
    print(f"wrote {args.out}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
