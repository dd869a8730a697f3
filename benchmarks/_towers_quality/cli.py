"""The command line: datasets x seeds x variants, the tables, the JSON and the figure."""

from __future__ import annotations

import argparse
import datetime
import logging
import statistics
import sys
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

from _towers_quality import datasets, report, variants
from _towers_quality.stats import paired_interval
from _towers_quality.training import train
from lightning_embark.lists import parse_list

REPO = Path(__file__).resolve().parents[2]
DEFAULT_DATA = REPO.parent / "shared" / "data"
COMMAND = "python benchmarks/towers_quality.py"


@dataclass(frozen=True, kw_only=True)
class Config:
    """What to run.

    Attributes:
        data_dir: Where the datasets' files are.
        datasets: ``frappe`` and / or ``movielens``.
        seeds: Training seeds (the split stays fixed).
        variants: Labels of :data:`~_towers_quality.variants.VARIANTS`.
        warmup_steps: Steps of the flat run after which its affinity is read.
        max_steps: Stop every run after this many steps (None: the recipe's epochs).
    """

    data_dir: str
    datasets: tuple[str, ...] = datasets.DATASETS
    seeds: tuple[int, ...] = tuple(range(10))
    variants: tuple[str, ...] = tuple(v.label for v in variants.VARIANTS)
    warmup_steps: int = 200
    max_steps: int | None = None


def run_dataset(config: Config, name: str) -> dict[str, Any]:
    """Every seed's flat run and variants on dataset ``name`` (see :mod:`.report`)."""
    data = datasets.load(name, Path(config.data_dir))
    chosen = [variants.BY_LABEL[label] for label in config.variants]
    labels = ["flat", *(v.label for v in chosen)]
    aucs: dict[str, list[float]] = {label: [] for label in labels}
    seconds: dict[str, list[float]] = {label: [] for label in labels}
    wire: dict[str, list[float]] = {v.label: [] for v in chosen}
    kept: dict[str, list[float]] = {v.label: [] for v in chosen}
    towers_seen: dict[str, list[list[list[str]]]] = {v.label: [] for v in chosen}
    for seed in config.seeds:
        flat = train(
            data, seed, None, warmup_steps=config.warmup_steps, max_steps=config.max_steps
        )
        aucs["flat"].append(flat.auc)
        seconds["flat"].append(flat.seconds)
        for variant in chosen:
            towers = variants.towers_for(
                variant, data.spec, data.recipe.batch_size, flat.affinity, seed
            )
            run = train(data, seed, towers, max_steps=config.max_steps)
            aucs[variant.label].append(run.auc)
            seconds[variant.label].append(run.seconds)
            wire[variant.label].append(variants.wire_ratio(towers, data.spec))
            if flat.affinity is not None:
                kept[variant.label].append(variants.kept(towers, flat.affinity))
            towers_seen[variant.label].append([list(t.tables) for t in towers])
        line = ", ".join(f"{k} {v[-1]:.4f}" for k, v in aucs.items())
        print(f"{name} seed {seed}: {line}", file=sys.stderr, flush=True)
    return {
        "rows": list(data.rows),
        "recipe": asdict(data.recipe),
        "aucs": aucs,
        "seconds": seconds,
        "wire": {k: statistics.mean(v) for k, v in wire.items()},
        "kept": {k: v for k, v in kept.items() if v},
        "towers": towers_seen,
    }


def summary(result: dict[str, Any]) -> dict[str, Any]:
    """Each variant's paired interval against flat (the JSON's digest)."""
    flat = result["aucs"]["flat"]
    return {
        label: paired_interval(values, flat).to_dict()
        for label, values in result["aucs"].items()
        if label != "flat"
    }


def _seeds(text: str) -> tuple[int, ...]:
    """``0,1,2`` or ``0-9``."""
    if "-" in text and "," not in text:
        first, last = (int(x) for x in text.split("-"))
        return tuple(range(first, last + 1))
    return parse_list(text, int, what="--seeds")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="towers_quality.py", description=__doc__)
    parser.add_argument("--data-dir", default=str(DEFAULT_DATA))
    parser.add_argument("--datasets", default=",".join(datasets.DATASETS))
    parser.add_argument("--seeds", default="0-9", help="0,1,2 or 0-9 (default 0-9)")
    parser.add_argument("--variants", default=None, help="comma list of labels (default all)")
    parser.add_argument(
        "--warmup-steps", type=int, default=200, help="as embark-towers' default (200)"
    )
    parser.add_argument("--json", default=None)
    parser.add_argument("--plot", default=None)
    parser.add_argument("--smoke", action="store_true", help="two seeds, a few steps")
    return parser.parse_args(argv)


def _config(args: argparse.Namespace) -> Config:
    chosen: tuple[str, ...] | None = (
        parse_list(args.variants, what="--variants") if args.variants else None
    )
    config = Config(
        data_dir=args.data_dir,
        datasets=parse_list(args.datasets, what="--datasets"),
        seeds=_seeds(args.seeds),
        warmup_steps=args.warmup_steps,
    )
    if chosen:
        config = replace(config, variants=chosen)
    if args.smoke:
        config = replace(
            config,
            seeds=config.seeds[:2],
            max_steps=3,
            warmup_steps=2,
            variants=chosen or ("dot r4", "dot r4 random"),
        )
    return config


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    config = _config(args)
    unknown = [d for d in config.datasets if d not in datasets.DATASETS] + [
        v for v in config.variants if v not in variants.BY_LABEL
    ]
    if unknown or len(config.seeds) < 2:
        print(
            f"towers_quality: unknown {unknown} (datasets {list(datasets.DATASETS)}, variants "
            f"{list(variants.BY_LABEL)}), or fewer than 2 seeds",
            file=sys.stderr,
        )
        return 2
    absent = [p for d in config.datasets for p in datasets.missing(d, Path(config.data_dir))]
    if absent:
        print(
            f"towers_quality: missing {[str(p) for p in absent]}; pass --data-dir", file=sys.stderr
        )
        return 2
    for name in ("lightning", "lightning.pytorch"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    # One thread: on a shared machine an OpenMP team of two that waits for a busy core
    # made a step 50x slower; the model is small enough for one core.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        results = {name: run_dataset(config, name) for name in config.datasets}
    finally:
        torch.set_num_threads(threads)
    for name, result in results.items():
        print(report.accuracy_table(name, result))
        print()
        print(report.partition_table(name, result))
        print()
    command = " ".join([COMMAND, *(argv if argv is not None else sys.argv[1:])])
    date = datetime.date.today().isoformat()
    if args.json:
        doc = {
            "command": command,
            "date": date,
            "config": asdict(config),
            "results": results,
            "summary": {name: summary(r) for name, r in results.items()},
        }
        Path(args.json).write_text(__import__("json").dumps(doc, indent=2) + "\n")
    if args.plot:
        report.plot(results, args.plot, f"{command} ({date})")
    return 0
