"""Validation AUC of DLRM on the real Criteo sample: fp32 exchange vs compressed exchange.

The accuracy figure of compression: training with a compressed embedding exchange must reach
a validation AUC within 0.005 of fp32 exchange (mean over seeds). For every seed this
trains torchrec's DLRM (dot interaction, small MLPs, 26 hashed tables of width 16)
with ``strategy="embark"`` on ``--world-size`` gloo ranks, once with an fp32
exchange and once per compression. All runs execute the same hand-built plan (one RB
cluster whose tables are table-wise, row-wise and column-wise), so only the wire
format of the RB exchange differs: forward (pooled vectors) and backward (their
gradients) both compressed, fp8 as e4m3 forward and e5m2 backward like the codec.
Within a seed every run starts from the same dense and embedding weights and sees
the same batches in the same order, so per-seed deltas are paired comparisons.

The data is the deterministic 80/20 split (split seed 0) of the 10,000-row Criteo
sample; validation AUC and log-loss are computed once over *all* validation rows
(every rank's predictions gathered), not averaged over batches or ranks.

Usage::

    python benchmarks/criteo_compression_auc.py [--data PATH] [--seeds 0,1,2]
        [--world-size 2] [--epochs N] [--batch-size B]
        [--compressions fp16,bf16,fp8,int8] [--dense-compression bf16] [--json out.json] [--smoke]

``--dense-compression`` also sends the dense gradients in that format in every
compressed run (the fp32 reference keeps fp32 everywhere): what
``EmbarkStrategy(allow=[..., "bf16"])`` does by default.

``--smoke`` (1 seed, 1 compression, a few steps) is how the test suite keeps the
script working.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from lightning.pytorch import Callback, Trainer
from torch.utils.data import DataLoader, IterableDataset
from torchmetrics.functional.classification import binary_auroc
from torchrec.datasets.utils import Batch

from lightning_embark.data import CriteoDataset, criteo_spec
from lightning_embark.lists import parse_list
from lightning_embark.models import DLRMModule
from lightning_embark.plan import ClusterPlan, ClusterType, Compression, Plan, TableLayout, layouts
from lightning_embark.registry import register_strategies
from lightning_embark.spec import ModelSpec
from lightning_embark.strategies import EmbarkStrategy
from lightning_embark.testing import quiet_trainer, run_gloo_ranks

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO.parent / "shared" / "data" / "criteo-autorec-train-10k.txt"
#: The bar: |mean AUC(compressed) - mean AUC(fp32)| <= this.
AUC_TOLERANCE = 0.005
#: The reference every compression is compared with.
BASELINE = "fp32"
#: Seed of the train/validation split: the same split for every training seed.
SPLIT_SEED = 0
#: ``--smoke``: training steps per run.
SMOKE_STEPS = 4


@dataclass(frozen=True, kw_only=True)
class BenchConfig:
    """What to train and how.

    Attributes:
        data: The Criteo file.
        seeds: Training seeds (dense init, embedding init); the split stays fixed.
        world_size: Gloo ranks.
        epochs: Passes over the training split.
        batch_size: Examples per rank per step.
        compressions: Compressed wire formats compared with fp32.
        dense_compression: Dense-gradient wire format of the compressed runs.
        num_embeddings: Hashed rows per table.
        embedding_dim: Width of every table.
        dense_layers: Bottom MLP widths (ending at ``embedding_dim``).
        over_layers: Top MLP widths (ending at 1).
        dense_lr: Adagrad learning rate of the MLPs.
        sparse_lr: Row-wise Adagrad learning rate of the tables.
        max_steps: Stop each run after this many steps (None: all epochs).
    """

    data: str
    seeds: tuple[int, ...] = (0, 1, 2)
    world_size: int = 2
    epochs: int = 1
    batch_size: int = 64
    compressions: tuple[str, ...] = ("fp16", "bf16", "fp8", "int8")
    dense_compression: str = "fp32"
    num_embeddings: int = 20_000
    embedding_dim: int = 16
    dense_layers: tuple[int, ...] = (64, 16)
    over_layers: tuple[int, ...] = (64, 32, 1)
    dense_lr: float = 0.05
    sparse_lr: float = 0.02
    max_steps: int | None = None

    @property
    def variants(self) -> tuple[str, ...]:
        """fp32 first, then every compression (each once)."""
        return (BASELINE, *(c for c in dict.fromkeys(self.compressions) if c != BASELINE))


@dataclass(frozen=True, kw_only=True)
class RunResult:
    """One training run, evaluated on every validation row.

    Attributes:
        compression: Wire format of the RB exchange.
        seed: Training seed.
        val_auc: ROC AUC over all validation rows.
        val_logloss: Mean binary cross-entropy over all validation rows.
        val_rows: Validation rows evaluated.
        train_loss: Per-step training loss, mean over ranks.
        steps: Optimizer steps taken.
        seconds: Wall time of training plus evaluation.
    """

    compression: str
    seed: int
    val_auc: float
    val_logloss: float
    val_rows: int
    train_loss: list[float]
    steps: int
    seconds: float


@dataclass(frozen=True, kw_only=True)
class Summary:
    """One compression over all seeds.

    Attributes:
        compression: Wire format.
        auc_mean: Mean validation AUC over seeds.
        aucs: Per-seed validation AUCs, in seed order.
        delta_auc: ``auc_mean`` minus fp32's.
        max_seed_delta: Largest per-seed ``|AUC - fp32 AUC|`` (paired by seed).
        logloss_mean: Mean validation log-loss over seeds.
        delta_logloss: ``logloss_mean`` minus fp32's.
        within: ``|delta_auc| <= AUC_TOLERANCE``.
    """

    compression: str
    auc_mean: float
    aucs: list[float]
    delta_auc: float
    max_seed_delta: float
    logloss_mean: float
    delta_logloss: float
    within: bool


# --- the plan -------------------------------------------------------------------


def table_layout(index: int, table: str, world_size: int, embedding_dim: int) -> TableLayout:
    """A mix of RB layouts: every 4th table row-wise (hash), the next column-wise, the rest whole.

    Whole tables go round-robin over the ranks; column-wise falls back to whole when
    the width does not split evenly over the ranks.
    """
    ranks = range(world_size)
    if world_size > 1 and index % 4 == 0:
        return layouts.row_wise(table, "rb", ranks)
    if world_size > 1 and index % 4 == 1 and embedding_dim % world_size == 0:
        return layouts.column_wise(table, "rb", ranks)
    return layouts.table_wise(table, "rb", index % world_size)


def exchange_plan(spec: ModelSpec, world_size: int, compression: str) -> Plan:
    """The benchmark's plan: one RB cluster, forward and backward in ``compression``.

    The layouts depend only on the spec and world size, so the plans of all
    compressions differ in nothing but the wire format.
    """
    cluster = ClusterPlan(
        name="rb",
        type=ClusterType.RB,
        forward_compression=Compression(compression),
        backward_compression=Compression(compression),
    )
    tables = tuple(
        table_layout(i, t.name, world_size, t.embedding_dim) for i, t in enumerate(spec.tables)
    )
    plan = Plan(
        world_size=world_size, ranks_per_host=world_size, clusters=(cluster,), tables=tables
    )
    plan.validate(spec)
    return plan


# --- data -------------------------------------------------------------------------


class ListDataset(IterableDataset):
    """Pre-parsed batches, replayed in order every epoch (``DataLoader(batch_size=None)``)."""

    def __init__(self, batches: list[Batch]) -> None:
        super().__init__()
        self.batches = batches

    def __iter__(self) -> Iterator[Batch]:
        return iter(self.batches)


def load_split(config: BenchConfig, split: str, rank: int) -> list[Batch]:
    """This rank's batches of one split; validation keeps the last partial batch."""
    dataset = CriteoDataset(
        config.data,
        num_embeddings=config.num_embeddings,
        batch_size=config.batch_size,
        split=split,
        val_fraction=0.2,
        seed=SPLIT_SEED,
        rank=rank,
        world_size=config.world_size,
        drop_last=split == "train",
    )
    return list(dataset)


# --- one run ----------------------------------------------------------------------


class LossRecorder(Callback):
    """Keeps this rank's training loss of every step."""

    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.losses.append(float(outputs["loss"]))


def build_model(config: BenchConfig, spec: ModelSpec, seed: int) -> DLRMModule:
    """The DLRM with seeded dense weights (tables stay on ``meta`` until sharded)."""
    torch.manual_seed(seed)
    return DLRMModule(
        spec,
        interaction="dot",
        dense_arch_layer_sizes=list(config.dense_layers),
        over_arch_layer_sizes=list(config.over_layers),
        dense_optimizer="adagrad",
        dense_lr=config.dense_lr,
        sparse_optimizer="rowwise_adagrad",
        sparse_lr=config.sparse_lr,
    )


def build_trainer(
    config: BenchConfig,
    plan: Plan,
    seed: int,
    recorder: LossRecorder,
    *,
    dense_compression: str = BASELINE,
) -> Trainer:
    """A quiet CPU trainer over the embark strategy executing ``plan``."""
    strategy = EmbarkStrategy(plan=plan, seed=seed, dense_compression=dense_compression)
    return quiet_trainer(
        devices=config.world_size,
        strategy=strategy,
        max_epochs=config.epochs,
        max_steps=config.max_steps or -1,
        limit_val_batches=0,
        use_distributed_sampler=False,
        callbacks=[recorder],
    )


@torch.no_grad()
def predict(model: DLRMModule, batches: Sequence[Batch]) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits and labels of this rank's validation batches (every rank must call this)."""
    model.eval()
    logits = [model(b.dense_features, b.sparse_features) for b in batches]
    labels = [b.labels.float() for b in batches]
    return torch.cat(logits), torch.cat(labels)


def gather_rows(local: torch.Tensor) -> torch.Tensor:
    """Every rank's 1-D tensor, concatenated in rank order (sizes may differ)."""
    parts: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(parts, local)
    return torch.cat(parts)


def mean_over_ranks(values: list[float]) -> list[float]:
    """Element-wise mean of every rank's equally long list."""
    tensor = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(tensor)
    return (tensor / dist.get_world_size()).tolist()


def train_and_evaluate(
    config: BenchConfig,
    spec: ModelSpec,
    compression: str,
    seed: int,
    train: list[Batch],
    val: list[Batch],
) -> RunResult:
    """Train one model on this rank's batches and evaluate it on all validation rows."""
    start = time.perf_counter()
    recorder = LossRecorder()
    model = build_model(config, spec, seed)
    dense = BASELINE if compression == BASELINE else config.dense_compression
    plan = exchange_plan(spec, config.world_size, compression)
    trainer = build_trainer(config, plan, seed, recorder, dense_compression=dense)
    trainer.fit(model, DataLoader(ListDataset(train), batch_size=None))
    logits, labels = predict(model, val)
    logits, labels = gather_rows(logits), gather_rows(labels)
    return RunResult(
        compression=compression,
        seed=seed,
        val_auc=float(binary_auroc(torch.sigmoid(logits), labels.int())),
        val_logloss=float(F.binary_cross_entropy_with_logits(logits, labels)),
        val_rows=int(labels.numel()),
        train_loss=mean_over_ranks(recorder.losses),
        steps=int(trainer.global_step),
        seconds=time.perf_counter() - start,
    )


def quiet() -> None:
    """Silence Lightning's per-run banners and known-harmless warnings in the ranks."""
    for name in (
        "lightning.pytorch",
        "lightning.fabric",
        "lightning_embark",
        "torch.fx._symbolic_trace",
    ):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")


def rank_main(rank: int, world_size: int, config: BenchConfig, out_path: str) -> None:
    """One gloo rank: every seed x exchange format; rank 0 writes the results to ``out_path``."""
    quiet()
    register_strategies()
    spec = criteo_spec(config.num_embeddings, config.embedding_dim)
    train, val = load_split(config, "train", rank), load_split(config, "val", rank)
    results = []
    for seed in config.seeds:
        for compression in config.variants:
            result = train_and_evaluate(config, spec, compression, seed, train, val)
            results.append(dataclasses.asdict(result))
            if rank == 0:
                print(
                    f"  seed {seed} {compression:>5}: val AUC {result.val_auc:.4f}, log-loss "
                    f"{result.val_logloss:.4f}, {result.steps} steps, {result.seconds:.1f} s",
                    flush=True,
                )
    if rank == 0:
        Path(out_path).write_text(json.dumps(results))


# --- reporting --------------------------------------------------------------------


def summarize(runs: Sequence[RunResult], config: BenchConfig) -> list[Summary]:
    """Per compression: AUC and log-loss over seeds, and the paired deltas against fp32."""
    by = {(r.compression, r.seed): r for r in runs}
    base_aucs = [by[BASELINE, s].val_auc for s in config.seeds]
    base_auc = statistics.fmean(base_aucs)
    base_loss = statistics.fmean(by[BASELINE, s].val_logloss for s in config.seeds)
    summaries = []
    for compression in config.variants:
        aucs = [by[compression, s].val_auc for s in config.seeds]
        loss = statistics.fmean(by[compression, s].val_logloss for s in config.seeds)
        delta = statistics.fmean(aucs) - base_auc
        summaries.append(
            Summary(
                compression=compression,
                auc_mean=statistics.fmean(aucs),
                aucs=aucs,
                delta_auc=delta,
                max_seed_delta=max(abs(a - b) for a, b in zip(aucs, base_aucs, strict=False)),
                logloss_mean=loss,
                delta_logloss=loss - base_loss,
                within=abs(delta) <= AUC_TOLERANCE,
            )
        )
    return summaries


COLUMNS = (
    "compression",
    "AUC mean",
    "per-seed AUCs",
    "delta vs fp32",
    f"within {AUC_TOLERANCE}?",
    "max per-seed abs delta",
    "log-loss mean",
    "delta log-loss",
)
TABLE_HEADER = "| " + " | ".join(COLUMNS) + " |"


def _signed(value: float) -> str:
    """``value`` to 4 decimals with its sign, never ``-0.0000``."""
    return f"{round(value, 4) + 0.0:+.4f}"


def format_table(summaries: Sequence[Summary]) -> str:
    """The results as a Markdown table (fp32 first)."""
    lines = [TABLE_HEADER, "|" + "---|" * len(COLUMNS)]
    for s in summaries:
        within = "(reference)" if s.compression == BASELINE else ("yes" if s.within else "NO")
        lines.append(
            f"| {s.compression} | {s.auc_mean:.4f} | {', '.join(f'{a:.4f}' for a in s.aucs)} | "
            f"{_signed(s.delta_auc)} | {within} | {s.max_seed_delta:.4f} | {s.logloss_mean:.4f} | "
            f"{_signed(s.delta_logloss)} |"
        )
    return "\n".join(lines)


def run_benchmark(config: BenchConfig) -> tuple[list[RunResult], float]:
    """Start the ranks, run everything, return the runs and the total wall time."""
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "runs.json"
        run_gloo_ranks(rank_main, config.world_size, config, str(out))
        runs = [RunResult(**r) for r in json.loads(out.read_text())]
    return runs, time.perf_counter() - start


# --- command line -----------------------------------------------------------------


def _csv(kind: type, text: str) -> tuple[Any, ...]:
    return parse_list(text, kind, what="list")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--data", default=str(DEFAULT_DATA), help="Criteo DAC sample (tab-separated)"
    )
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated training seeds")
    parser.add_argument("--world-size", type=int, default=BenchConfig.world_size)
    parser.add_argument("--epochs", type=int, default=BenchConfig.epochs)
    parser.add_argument(
        "--batch-size", type=int, default=BenchConfig.batch_size, help="examples per rank per step"
    )
    parser.add_argument("--compressions", default=",".join(BenchConfig.compressions))
    parser.add_argument(
        "--dense-compression",
        default="fp32",
        choices=("fp32", "bf16", "fp16"),
        help="dense-gradient wire format of the compressed runs (the fp32 reference stays fp32)",
    )
    parser.add_argument(
        "--num-embeddings", type=int, default=BenchConfig.num_embeddings, help="rows per table"
    )
    parser.add_argument("--dense-lr", type=float, default=BenchConfig.dense_lr)
    parser.add_argument("--sparse-lr", type=float, default=BenchConfig.sparse_lr)
    parser.add_argument("--json", help="write config, runs and summary here")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help=f"1 seed, the first compression, {SMOKE_STEPS} steps per run (a test of the script)",
    )
    return parser.parse_args(argv)


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    """The :class:`BenchConfig` the arguments describe, checked."""
    seeds, compressions = _csv(int, args.seeds), _csv(str, args.compressions)
    for name in compressions:
        Compression(name)  # ValueError names the bad one
    if not seeds or args.world_size < 1 or args.epochs < 1 or args.batch_size < 1:
        raise SystemExit("need at least one seed, and world size, epochs and batch size >= 1")
    if args.smoke:
        seeds, compressions = seeds[:1], compressions[:1]
    return BenchConfig(
        data=args.data,
        seeds=seeds,
        world_size=args.world_size,
        epochs=1 if args.smoke else args.epochs,
        batch_size=args.batch_size,
        compressions=compressions,
        dense_compression=args.dense_compression,
        num_embeddings=args.num_embeddings,
        dense_lr=args.dense_lr,
        sparse_lr=args.sparse_lr,
        max_steps=SMOKE_STEPS if args.smoke else None,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark, print the table, optionally write JSON."""
    args = parse_args(argv)
    if not Path(args.data).is_file():
        print(f"error: Criteo sample {args.data!r} not found; pass --data PATH", file=sys.stderr)
        return 2
    config = config_from_args(args)
    print(
        f"Criteo {Path(config.data).name}: {config.world_size} gloo ranks, seeds "
        f"{list(config.seeds)}, {config.epochs} epoch(s), batch {config.batch_size}/rank, "
        f"{config.num_embeddings} rows x {config.embedding_dim} per table, exchanges "
        f"{list(config.variants)}, dense gradients of the compressed runs in "
        f"{config.dense_compression}",
        flush=True,
    )
    runs, seconds = run_benchmark(config)
    summaries = summarize(runs, config)
    print()
    print(format_table(summaries))
    print(
        f"\n{len(runs)} runs, {runs[0].val_rows} validation rows each, {runs[0].steps} steps per "
        f"run; total {seconds:.1f} s"
    )
    if args.json:
        report = {
            "config": dataclasses.asdict(config),
            "tolerance": AUC_TOLERANCE,
            "total_seconds": seconds,
            "runs": [dataclasses.asdict(r) for r in runs],
            "summary": [dataclasses.asdict(s) for s in summaries],
        }
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
