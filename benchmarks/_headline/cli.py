"""EMBark's headline evaluation side by side: measured on the emulated cluster, estimated at scale.

The command line of ``benchmarks/headline.py`` (whose docstring tells the whole suite):
options checked, then every row measured (:mod:`~_headline.measure`), the estimates at
scale (:mod:`~_headline.estimates`), and ``headline.md``, ``headline.png`` and
``headline.json`` written. It lives in the package, not in the script, so that mypy checks
its calls into the package. The first line above is ``--help``'s description.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import shlex
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from lightning_embark.lists import list_items, parse_list

from .estimates import estimate_rows
from .figure import plot_headline
from .measure import measure_workload
from .pilot import DEFAULT_RATE_MBIT, REFERENCE, SHARE_BAND, TARGET_SHARE
from .progress import log
from .report import render_markdown
from .runs import RunSettings, run_one
from .tables import MIN_REPEATS
from .workloads import QUICK, STRATEGY_RUNS, WORKLOADS


def parse_overrides(items: Sequence[str], keys: Sequence[str], what: str) -> dict[str, float]:
    """``KEY=VALUE`` options (``--rate-mbit t180=120``) as a dict, keys checked."""
    out: dict[str, float] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or key not in keys:
            raise ValueError(f"{what} {item!r}: give KEY=VALUE with KEY one of {list(keys)}")
        try:
            out[key] = float(value)
        except ValueError:
            raise ValueError(f"{what} {item!r}: {value!r} is not a number") from None
        if out[key] <= 0:
            raise ValueError(f"{what} {item!r}: must be positive")
    return out


def _commit() -> str | None:
    """The checkout's short commit, or None outside git: the report names the code that made
    its numbers, and a missing git must not lose an hour's run."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).resolve().parent,
        )
        return out.stdout.strip() or None
    return None


def build_parser() -> argparse.ArgumentParser:
    """The suite's options, their defaults those of the documented runs (docs/headline.md)."""
    keys = [w.key for w in WORKLOADS]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", type=Path, default=Path("headline"))
    parser.add_argument(
        "--models", default=",".join(keys), help=f"comma-separated rows, of {keys}"
    )
    parser.add_argument("--strategies", default=",".join(STRATEGY_RUNS))
    parser.add_argument(
        "--repeats",
        type=int,
        default=6,
        help="alternating paired repeats (at least 5; 6 is the least whose Wilcoxon interval "
        "reaches 95%%)",
    )
    parser.add_argument("--steps", type=int, default=10, help="measured steps per run")
    parser.add_argument("--warmup", type=int, default=3, help="unmeasured steps per run")
    parser.add_argument("--pilot-steps", type=int, default=5, help="measured steps per pilot run")
    parser.add_argument("--pilot-warmup", type=int, default=2)
    parser.add_argument("--start-rate-mbit", type=float, default=DEFAULT_RATE_MBIT)
    parser.add_argument(
        "--target-share",
        type=float,
        default=TARGET_SHARE,
        help=f"the exposed share of {REFERENCE}'s step the pilot aims at (30-50%% accepted)",
    )
    parser.add_argument(
        "--rate-mbit",
        action="append",
        default=[],
        metavar="ROW=RATE",
        help="the row's link rate, skipping its pilot (repeatable)",
    )
    parser.add_argument(
        "--batch-size",
        action="append",
        default=[],
        metavar="ROW=N",
        help="the row's per-rank batch (repeatable)",
    )
    parser.add_argument(
        "--allow",
        default="fp16,bf16",
        help="the compressed rows' compressions (fp8 and int8 also kept AUC within 0.005 on "
        "the Criteo sample, docs/benchmarks.md#accuracy-with-compression)",
    )
    parser.add_argument(
        "--tower-compression",
        choices=("fp32", "bf16", "fp16", "fp8", "int8"),
        default=None,
        help="embark-towers-compressed's tower outputs' wire format (default: the first of "
        "--allow, fp32 when it is empty)",
    )
    parser.add_argument(
        "--dense-compression",
        choices=("fp32", "bf16", "fp16"),
        default="fp32",
        help="every run's dense-gradient wire format",
    )
    parser.add_argument(
        "--dense-exchange",
        choices=("flat", "hierarchical"),
        default=None,
        help="every run's dense all-reduce: one over all ranks, or embark's host-aware one "
        "(torchrec's DDP too); default: each strategy's own (torchrec flat, embark "
        "hierarchical)",
    )
    parser.add_argument("--loopback", action="store_true", help="no emulation, no shaped link")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--estimate-hosts", default="8,16", help="hosts of the estimate table")
    parser.add_argument("--estimate-ranks-per-host", type=int, default=8)
    parser.add_argument("--estimate-batch", type=int, default=4096)
    parser.add_argument("--topology", default="dgx-h100")
    parser.add_argument(
        "--torchrec-timeout",
        type=int,
        default=600,
        metavar="SECONDS",
        help="torchrec's search budget per estimated plan, enough for it to finish (0: none)",
    )
    parser.add_argument(
        "--no-pipeline",
        action="store_true",
        help="runs without their strategy's input pipeline (default: torchrec's "
        "TrainPipelineSparseDist for the torchrec rows, embark's IDs a step ahead)",
    )
    parser.add_argument(
        "--no-exposed",
        action="store_true",
        help="shaped runs only (default: every run also unshaped, back to back, for its "
        "exposed communication)",
    )
    parser.add_argument("--no-estimates", action="store_true")
    parser.add_argument("--estimates-only", action="store_true")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="demo-small, 1 repeat, 3 steps, estimates at 8 x 8 only with 10 s searches "
        "(a smoke run)",
    )
    return parser


def main(argv: list[str] | None = None, *, runner: Callable[..., dict[str, Any]] = run_one) -> int:
    """Run the suite and write its report; 0 on success (bad options exit through argparse).

    Args:
        argv: The options, ``sys.argv[1:]`` when None (the report then names the command as
            it was typed).
        runner: One strategy's run, :func:`run_one`; tests give a fake, since no emulated
            cluster starts there.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    keys = [w.key for w in WORKLOADS]
    labels = list_items(args.strategies)
    if bad := [s for s in labels if s not in STRATEGY_RUNS]:
        parser.error(f"--strategies {bad}: choose from {list(STRATEGY_RUNS)}")
    allow = tuple(list_items(args.allow))
    if args.quick:
        workloads = [QUICK]
        args.repeats, args.steps, args.warmup = 1, 3, 1
        args.pilot_steps, args.pilot_warmup = 3, 1
        args.estimate_hosts, args.torchrec_timeout = "8", 10
        keys = [QUICK.key]
    else:
        chosen = list_items(args.models)
        if bad := [m for m in chosen if m not in keys]:
            parser.error(f"--models {bad}: choose from {keys}")
        workloads = [w for w in WORKLOADS if w.key in chosen]
    try:
        rates = parse_overrides(args.rate_mbit, keys, "--rate-mbit")
        batches = parse_overrides(args.batch_size, keys, "--batch-size")
        hosts_list = list(parse_list(args.estimate_hosts, int, what="--estimate-hosts"))
    except ValueError as error:
        parser.error(str(error))
    if args.repeats < 1 or args.steps < 1 or args.warmup < 0:
        parser.error("--repeats and --steps must be >= 1, --warmup >= 0")
    if args.repeats < MIN_REPEATS and not args.quick:
        log(f"--repeats {args.repeats}: fewer than {MIN_REPEATS}, the report makes no verdicts")
    if not 0 < args.target_share < 1:
        parser.error(f"--target-share {args.target_share}: give a share within (0, 1)")
    tower_compression = args.tower_compression or (allow[0] if allow else "fp32")
    workloads = [
        dataclasses.replace(w, batch_size=int(batches[w.key])) if w.key in batches else w
        for w in workloads
    ]
    settings = RunSettings(
        steps=args.steps,
        warmup=args.warmup,
        allow=allow,
        dense_compression=args.dense_compression,
        loopback=args.loopback,
        seed=args.seed,
        pipeline=not args.no_pipeline,
        exposed=not args.no_exposed and not args.loopback,
        tower_compression=tower_compression,
        dense_exchange=args.dense_exchange,
    )
    args.out_dir.mkdir(parents=True, exist_ok=True)
    command = shlex.join(
        [Path(sys.argv[0]).name if argv is None else "headline.py", *(argv or sys.argv[1:])]
    )
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    measured = []
    if not args.estimates_only:
        for w in workloads:
            measured.append(
                measure_workload(
                    w,
                    labels,
                    repeats=args.repeats,
                    rate_override=rates.get(w.key),
                    start_rate=args.start_rate_mbit,
                    pilot_steps=args.pilot_steps,
                    pilot_warmup=args.pilot_warmup,
                    target=args.target_share,
                    settings=settings,
                    spec_dir=args.out_dir / "specs",
                    runner=runner,
                )
            )
    estimates: list[dict[str, Any]] = []
    if not args.no_estimates:
        models = list(dict.fromkeys(w.model for w in workloads))
        estimates = estimate_rows(
            models,
            hosts_list,
            labels=labels,
            ranks_per_host=args.estimate_ranks_per_host,
            batch_size=args.estimate_batch,
            topology_name=args.topology,
            allow=allow,
            timeout=args.torchrec_timeout or None,
        )
    markdown = render_markdown(
        command=command,
        date=date,
        commit=_commit(),
        measured=measured,
        estimates=estimates,
        labels=labels,
        settings=settings,
        repeats=args.repeats,
        target=args.target_share,
        topology=args.topology,
        torchrec_timeout=args.torchrec_timeout or None,
    )
    (args.out_dir / "headline.md").write_text(markdown)
    print(markdown)
    if measured:
        plot_headline(measured, labels, args.out_dir / "headline.png")
    doc = {
        "command": command,
        "date": date,
        "commit": _commit(),
        "settings": dataclasses.asdict(settings) | {"repeats": args.repeats},
        "target_share": args.target_share,
        "share_band": list(SHARE_BAND),
        "reference": REFERENCE,
        "labels": labels,
        "workloads": measured,
        "estimates": estimates,
        "estimate_settings": {
            "topology": args.topology,
            "hosts": hosts_list,
            "ranks_per_host": args.estimate_ranks_per_host,
            "batch_size": args.estimate_batch,
            "torchrec_timeout_s": args.torchrec_timeout,
        },
    }
    (args.out_dir / "headline.json").write_text(json.dumps(doc, indent=1))
    log(
        f"wrote {args.out_dir}/headline.json, headline.md" + (", headline.png" if measured else "")
    )
    return 0
