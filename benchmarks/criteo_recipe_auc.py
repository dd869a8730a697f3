"""The DLRM-on-Criteo recipe: embark on 4 ranks vs single-process training, and throughput vs
torchrec.

The recipe check, on the real Criteo sample (``examples/dlrm_criteo.py``'s model and
data module, deterministic 80/20 split):

1. **AUC.** For every seed, train the recipe's DLRM once in a single process without
   any sharding (``strategy="auto"``, global batches of ``world_size x batch_size``) and
   once with ``strategy="embark"`` (automatic lossless plan, fp32 exchange, embedding
   gradients averaged like DDP's dense ones) on ``--world-size`` gloo ranks of
   ``--batch-size`` each. Both start from the same weights (seeded dense init, tables
   allocated and seeded before the strategy shards them) and see the same global
   batches, so the runs are paired; the table prints the validation AUC of each (over
   every validation line, all ranks' predictions together) and the difference, with
   the target ``|diff| <= 0.002``.
2. **Throughput** (``--throughput``): the recipe under torchrun on the emulated cluster
   (``--hosts`` x ``--ranks-per-host``, shaped inter-host links; plain loopback, labelled
   so, without root), ``--trainer.num_nodes`` x ``--trainer.devices``, once per strategy
   per repeat, strategies interleaved; samples/s from the median step time (slowest
   rank per step, after warm-up), as ``embark-bench`` reports it. Ratios to the first
   strategy (torchrec) are per repeat, then the median.

Usage::

    python benchmarks/criteo_recipe_auc.py [--data PATH] [--seeds 0,1,2] [--world-size 4]
        [--batch-size 32] [--throughput] [--repeats 3] [--json out.json] [--smoke]

``--smoke`` (1 seed, the first 600 lines, a few steps, no throughput) is how the test
suite keeps the script working.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import os
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from lightning_embark.lists import parse_list
from lightning_embark.testing import load_module

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "examples" / "dlrm_criteo.py"
DEFAULT_DATA = REPO.parent / "shared" / "data" / "criteo-autorec-train-10k.txt"
#: The bar: |AUC(embark) - AUC(single process)| <= this, per seed.
AUC_TOLERANCE = 0.002
#: ``--smoke``: lines of the file used, and training steps per run.
SMOKE_LINES = 600
SMOKE_STEPS = 3


def load_recipe() -> ModuleType:
    """``examples/dlrm_criteo.py`` as a module (examples/ is not a package)."""
    return load_module(RECIPE, "_dlrm_criteo_recipe")


@dataclass(frozen=True, kw_only=True)
class AucConfig:
    """The paired AUC runs.

    Attributes:
        data: The Criteo file.
        seeds: Training seeds (weights); the 80/20 split stays fixed (split seed 0).
        world_size: Gloo ranks of the embark run.
        ranks_per_host: Ranks per (pretend) host of the embark run: its plan and dense
            all-reduce are hierarchical when this is below ``world_size``.
        batch_size: Examples per rank per step; the single process takes
            ``world_size`` times this.
        epochs: Passes over the training split.
        max_train_batches: Stop each epoch after this many steps (None: whole epoch).
    """

    data: str
    seeds: tuple[int, ...] = (0, 1, 2)
    world_size: int = 4
    ranks_per_host: int = 2
    batch_size: int = 32
    epochs: int = 1
    max_train_batches: int | None = None


@dataclass(frozen=True, kw_only=True)
class AucRun:
    """One training run and its validation metrics.

    Attributes:
        mode: ``"single"`` or ``"embark"``.
        seed: Training seed.
        world_size: Ranks.
        val_auc: ROC AUC over every validation line.
        val_loss: Mean validation loss (mean over ranks of their batch means).
        train_loss: Per-step training loss (embark: mean over ranks, i.e. the global batch's).
        steps: Optimizer steps.
        seconds: Wall time of the run (setup, training, validation).
    """

    mode: str
    seed: int
    world_size: int
    val_auc: float
    val_loss: float
    train_loss: list[float]
    steps: int
    seconds: float


@dataclass(frozen=True, kw_only=True)
class AucRow:
    """One seed: single process vs embark."""

    seed: int
    single_auc: float
    embark_auc: float
    diff: float
    max_train_loss_diff: float
    within: bool


# --- the AUC runs (gloo ranks) -----------------------------------------------------


def _quiet() -> None:
    for name in (
        "lightning.pytorch",
        "lightning.fabric",
        "lightning_embark",
        "torch.fx._symbolic_trace",
        "torchrec",
    ):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")


def _auc_rank(
    rank: int, world_size: int, config: AucConfig, mode: str, seed: int, out_path: str
) -> None:
    """One rank of one run; rank 0 writes the :class:`AucRun` as JSON to ``out_path``."""
    import torch
    import torch.distributed as dist
    from lightning.pytorch import Callback, Trainer

    from lightning_embark.data import CriteoDataModule
    from lightning_embark.registry import register_strategies
    from lightning_embark.strategies import EmbarkStrategy

    _quiet()
    register_strategies()
    recipe = load_recipe()
    if mode == "embark":
        os.environ["EMBARK_RANKS_PER_HOST"] = str(config.ranks_per_host)
    start = time.perf_counter()
    torch.manual_seed(seed)
    per_rank = config.batch_size if mode == "embark" else config.batch_size * config.world_size
    data = CriteoDataModule(
        config.data, batch_size=per_rank, num_embeddings=recipe.RECIPE_NUM_EMBEDDINGS
    )
    # Seeded tables, allocated here: the same start for both runs.
    model = recipe.CTRDLRM(
        tables=data.table_rows,
        num_dense_features=data.num_dense_features,
        materialize_tables=True,
    )

    class Losses(Callback):
        def __init__(self) -> None:
            self.values: list[float] = []

        def on_train_batch_end(
            self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int
        ) -> None:
            self.values.append(float(outputs["loss"]))

    losses = Losses()
    trainer = Trainer(
        **(
            recipe.TRAINER_DEFAULTS
            | {
                "devices": world_size,
                "max_epochs": config.epochs,
                "logger": False,
                "enable_progress_bar": False,
                "enable_model_summary": False,
                "callbacks": [losses],
                "strategy": EmbarkStrategy(seed=seed) if mode == "embark" else "auto",
                "limit_train_batches": config.max_train_batches or 1.0,
            }
        )
    )
    trainer.fit(model, datamodule=data)
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    train_loss = torch.tensor(losses.values, dtype=torch.float64)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(train_loss)
        train_loss /= dist.get_world_size()
    if rank == 0:
        run = AucRun(
            mode=mode,
            seed=seed,
            world_size=world_size,
            val_auc=metrics["val_auc"],
            val_loss=metrics["val_loss"],
            train_loss=train_loss.tolist(),
            steps=trainer.global_step,
            seconds=time.perf_counter() - start,
        )
        Path(out_path).write_text(json.dumps(dataclasses.asdict(run)))


def run_auc(config: AucConfig) -> list[AucRun]:
    """Every seed: the single-process run (1 rank), then the embark run."""
    from lightning_embark.testing import run_gloo_ranks

    load_recipe()
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in config.seeds:
            for mode, world in (("single", 1), ("embark", config.world_size)):
                out = Path(tmp) / f"{mode}-{seed}.json"
                run_gloo_ranks(_auc_rank, world, config, mode, seed, str(out))
                run = AucRun(**json.loads(out.read_text()))
                runs.append(run)
                print(
                    f"  seed {seed} {mode:>6} ({world} rank(s)): val AUC {run.val_auc:.4f}, val "
                    f"loss {run.val_loss:.4f}, {run.steps} steps, {run.seconds:.1f} s",
                    flush=True,
                )
    return runs


def auc_rows(runs: Sequence[AucRun]) -> list[AucRow]:
    """Pairs the runs by seed."""
    by = {(r.mode, r.seed): r for r in runs}
    rows = []
    for seed in dict.fromkeys(r.seed for r in runs):
        single, embark = by["single", seed], by["embark", seed]
        diff = embark.val_auc - single.val_auc
        loss_diff = max(
            (abs(a - b) for a, b in zip(single.train_loss, embark.train_loss, strict=False)),
            default=math.nan,
        )
        row = AucRow(
            seed=seed,
            single_auc=single.val_auc,
            embark_auc=embark.val_auc,
            diff=diff,
            max_train_loss_diff=loss_diff,
            within=abs(diff) <= AUC_TOLERANCE,
        )
        rows.append(row)
    return rows


AUC_COLUMNS = (
    "seed",
    "single-process val AUC",
    "embark val AUC",
    "difference",
    f"within {AUC_TOLERANCE}?",
    "max per-step train-loss diff",
)
AUC_HEADER = "| " + " | ".join(AUC_COLUMNS) + " |"


def format_auc_table(rows: Sequence[AucRow]) -> str:
    """Markdown table, one row per seed."""
    lines = [AUC_HEADER, "|" + "---|" * len(AUC_COLUMNS)]
    for r in rows:
        lines.append(
            f"| {r.seed} | {r.single_auc:.4f} | {r.embark_auc:.4f} | {r.diff + 0.0:+.4f} | "
            f"{'yes' if r.within else 'NO'} | {r.max_train_loss_diff:.1e} |"
        )
    return "\n".join(lines)


# --- throughput on the emulated cluster -----------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ThroughputConfig:
    """The throughput runs.

    Attributes:
        data: The Criteo file.
        strategies: Strategy names; the first is the baseline of the ratios.
        hosts: Emulated hosts.
        ranks_per_host: Ranks per host.
        batch_size: Examples per rank per step.
        steps: Measured steps per run.
        warmup: Steps before measuring.
        repeats: Runs per strategy (interleaved).
        rate_mbit: Inter-host link rate; None: the cluster default.
        loopback: Run on plain loopback (not emulated).
    """

    data: str
    strategies: tuple[str, ...] = ("torchrec", "embark")
    hosts: int = 2
    ranks_per_host: int = 2
    batch_size: int = 256
    steps: int = 20
    warmup: int = 3
    repeats: int = 3
    rate_mbit: float | None = None
    loopback: bool = False


def recipe_argv(config: ThroughputConfig, strategy: str, report_dir: Path) -> list[str]:
    """The recipe's command line for one throughput run (after ``torchrun [options]``)."""
    return [
        str(RECIPE),
        "fit",
        "--data.path",
        config.data,
        "--data.batch_size",
        str(config.batch_size),
        "--trainer.strategy",
        strategy,
        "--trainer.num_nodes",
        str(config.hosts),
        "--trainer.devices",
        str(config.ranks_per_host),
        "--trainer.max_steps",
        str(config.warmup + config.steps),
        "--trainer.max_epochs",
        "1000",
        "--trainer.limit_val_batches",
        "0",
        "--trainer.logger",
        "false",
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.enable_model_summary",
        "false",
        "--report_dir",
        str(report_dir),
    ]


def summarize_throughput(
    runs: Sequence[dict[str, Any]], strategies: Sequence[str]
) -> list[dict[str, Any]]:
    """Per strategy: median samples/s and step time over repeats, and the median per-repeat ratio
    to the first."""
    base = strategies[0]
    by: dict[str, list[dict[str, Any]]] = {
        s: [r for r in runs if r["strategy"] == s] for s in strategies
    }
    out = []
    for strategy in strategies:
        mine = by[strategy]
        ratios = [
            m["samples_per_s"] / b["samples_per_s"] for m, b in zip(mine, by[base], strict=False)
        ]
        out.append(
            {
                "strategy": strategy,
                "samples_per_s": [m["samples_per_s"] for m in mine],
                "median_samples_per_s": statistics.median(m["samples_per_s"] for m in mine),
                "median_step_ms": statistics.median(m["step_time_ms"]["median"] for m in mine),
                "ratio_per_repeat": ratios,
                "median_ratio": statistics.median(ratios),
                "inter_host_mb_per_step": statistics.median(
                    m["bytes_per_step"]["inter_host"] / 1e6 for m in mine
                ),
                "intra_host_mb_per_step": statistics.median(
                    m["bytes_per_step"]["intra_host"] / 1e6 for m in mine
                ),
            }
        )
    return out


def format_throughput_table(rows: Sequence[dict[str, Any]]) -> str:
    """Markdown table of :func:`summarize_throughput`."""
    base = rows[0]["strategy"]
    header = (
        f"| strategy | median samples/s | median step ms | samples/s per repeat | x {base} "
        "(median of per-repeat ratios) | inter-host MB/step | intra-host MB/step |"
    )
    lines = [header, "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['strategy']} | {r['median_samples_per_s']:.0f} | {r['median_step_ms']:.1f} | "
            f"{', '.join(f'{x:.0f}' for x in r['samples_per_s'])} | {r['median_ratio']:.2f} "
            f"({', '.join(f'{x:.2f}' for x in r['ratio_per_repeat'])}) | "
            f"{r['inter_host_mb_per_step']:.2f} | {r['intra_host_mb_per_step']:.2f} |"
        )
    return "\n".join(lines)


def run_throughput(config: ThroughputConfig) -> tuple[list[dict[str, Any]], str]:
    """Every repeat runs every strategy on one emulated cluster; returns the runs and the cluster
    label."""
    from lightning_embark.emulation import (
        DEFAULT_RATE_MBIT,
        QUIET_RANK_ENV,
        EmulatedHosts,
        EmulationConfig,
    )
    from lightning_embark.errors import EmbarkError
    from lightning_embark.harness import load_rank_records, summarize_run

    cluster_config = EmulationConfig(
        num_hosts=config.hosts,
        ranks_per_host=config.ranks_per_host,
        rate_mbit=DEFAULT_RATE_MBIT if config.rate_mbit is None else config.rate_mbit,
    )
    runs: list[dict[str, Any]] = []
    env = {**QUIET_RANK_ENV, "PYTHONWARNINGS": "ignore"}
    with (
        tempfile.TemporaryDirectory() as tmp,
        EmulatedHosts(cluster_config, force_loopback=config.loopback) as cluster,
    ):
        label = cluster.describe()
        print(f"[throughput] {label}", flush=True)
        for repeat in range(config.repeats):
            for strategy in config.strategies:
                out = Path(tmp) / f"{strategy}-{repeat}"
                code = cluster.run(recipe_argv(config, strategy, out), env=env)
                if code != 0:
                    raise EmbarkError(
                        f"the recipe with strategy {strategy!r} failed (exit code {code}); see "
                        "above"
                    )
                run = summarize_run(strategy, load_rank_records(out), warmup=config.warmup)
                run["repeat"] = repeat
                runs.append(run)
                print(
                    f"  repeat {repeat} {strategy:>14}: {run['samples_per_s']:.0f} samples/s, "
                    f"median step {run['step_time_ms']['median']:.1f} ms",
                    flush=True,
                )
    return runs, label


# --- command line ------------------------------------------------------------------


def _csv(kind: type, text: str) -> tuple[Any, ...]:
    return parse_list(text, kind, what="list")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--data", default=str(DEFAULT_DATA), help="Criteo DAC file (tab-separated)"
    )
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated training seeds")
    parser.add_argument(
        "--world-size", type=int, default=AucConfig.world_size, help="ranks of the embark AUC run"
    )
    parser.add_argument(
        "--ranks-per-host",
        type=int,
        default=AucConfig.ranks_per_host,
        help="ranks per host of the embark AUC run (hierarchical plan when < world size)",
    )
    parser.add_argument(
        "--batch-size", type=int, default=AucConfig.batch_size, help="examples per rank per step"
    )
    parser.add_argument("--epochs", type=int, default=AucConfig.epochs)
    parser.add_argument("--no-auc", action="store_true", help="skip the AUC runs")
    parser.add_argument(
        "--throughput", action="store_true", help="also measure throughput on the emulated cluster"
    )
    parser.add_argument(
        "--strategies", default="torchrec,embark", help="throughput: strategies, baseline first"
    )
    parser.add_argument("--hosts", type=int, default=ThroughputConfig.hosts)
    parser.add_argument(
        "--throughput-batch-size",
        type=int,
        default=ThroughputConfig.batch_size,
        help="throughput: examples per rank per step",
    )
    parser.add_argument(
        "--steps", type=int, default=ThroughputConfig.steps, help="throughput: measured steps"
    )
    parser.add_argument("--warmup", type=int, default=ThroughputConfig.warmup)
    parser.add_argument("--repeats", type=int, default=ThroughputConfig.repeats)
    parser.add_argument(
        "--rate-mbit",
        type=float,
        default=None,
        help="inter-host link rate (default: the cluster's)",
    )
    parser.add_argument(
        "--loopback", action="store_true", help="throughput on plain loopback (NOT emulated)"
    )
    parser.add_argument("--json", help="write config, runs and tables here")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help=f"1 seed, the first {SMOKE_LINES} lines, {SMOKE_STEPS} steps, no throughput",
    )
    return parser.parse_args(argv)


def _first_lines(path: str, count: int, folder: str) -> str:
    """A temporary copy of the first ``count`` lines of ``path`` (outside the repository)."""
    target = Path(folder) / f"first-{count}-{Path(path).name}"
    with open(path, "rb") as src, open(target, "wb") as dst:
        dst.writelines(line for _, line in zip(range(count), src, strict=False))
    return str(target)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the AUC check (and the throughput runs), print the tables, optionally write JSON."""
    args = parse_args(argv)
    if not Path(args.data).is_file():
        print(f"error: Criteo file {args.data!r} not found; pass --data PATH", file=sys.stderr)
        return 2
    seeds = _csv(int, args.seeds)
    if not seeds or args.world_size < 1 or args.batch_size < 1 or args.epochs < 1:
        raise SystemExit("need at least one seed, and world size, batch size and epochs >= 1")
    if args.world_size % args.ranks_per_host:
        raise SystemExit(
            f"--ranks-per-host {args.ranks_per_host} must divide --world-size {args.world_size}"
        )
    report: dict[str, Any] = {"tolerance": AUC_TOLERANCE}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        data = _first_lines(args.data, SMOKE_LINES, tmp) if args.smoke else args.data
        if not args.no_auc:
            auc = AucConfig(
                data=data,
                seeds=seeds[:1] if args.smoke else seeds,
                world_size=args.world_size,
                ranks_per_host=args.ranks_per_host,
                batch_size=args.batch_size,
                epochs=1 if args.smoke else args.epochs,
                max_train_batches=SMOKE_STEPS if args.smoke else None,
            )
            print(
                "AUC: Criteo "
                f"{Path(args.data).name}{f' (first {SMOKE_LINES} lines)' if args.smoke else ''}, "
                f"80/20 split; single process with batch {auc.world_size * auc.batch_size} vs "
                f"embark on {auc.world_size} gloo ranks x {auc.batch_size} "
                f"({auc.world_size // auc.ranks_per_host} host(s) x {auc.ranks_per_host}), seeds "
                f"{list(auc.seeds)}",
                flush=True,
            )
            runs = run_auc(auc)
            rows = auc_rows(runs)
            print()
            print(format_auc_table(rows))
            print()
            report["auc"] = {
                "config": dataclasses.asdict(auc),
                "runs": [dataclasses.asdict(r) for r in runs],
                "rows": [dataclasses.asdict(r) for r in rows],
            }
        if args.throughput and not args.smoke:
            tp = ThroughputConfig(
                data=args.data,
                strategies=_csv(str, args.strategies),
                hosts=args.hosts,
                ranks_per_host=args.ranks_per_host,
                batch_size=args.throughput_batch_size,
                steps=args.steps,
                warmup=args.warmup,
                repeats=args.repeats,
                rate_mbit=args.rate_mbit,
                loopback=args.loopback,
            )
            print(
                f"Throughput: the recipe, {tp.hosts} hosts x {tp.ranks_per_host} ranks, batch "
                f"{tp.batch_size}/rank, {tp.warmup} warm-up + {tp.steps} measured steps, "
                f"{tp.repeats} repeat(s) of {list(tp.strategies)}",
                flush=True,
            )
            tp_runs, label = run_throughput(tp)
            rows_tp = summarize_throughput(tp_runs, tp.strategies)
            print()
            print(label)
            print(format_throughput_table(rows_tp))
            print()
            report["throughput"] = {
                "config": dataclasses.asdict(tp),
                "cluster": label,
                "runs": tp_runs,
                "summary": rows_tp,
            }
    seconds = time.perf_counter() - started
    report["total_seconds"] = seconds
    print(f"total {seconds:.1f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
