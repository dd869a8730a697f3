"""Validation AUC on the real Criteo sample: flat DLRM against DLRM over DMT towers.

Compressing towers change the model (the interaction reads each tower's output instead
of its features' vectors), so their cost in accuracy is measured here: for every seed,
torchrec's DLRM (dot interaction, 26 hashed tables of width 16) is trained flat, then
over towers with ``projection`` and ``dcn`` tower modules at ratios 2 and 4, the towers
from the learned partitioner (``embark-towers``' method: the flat model trains
``--warmup-steps`` steps with the seed, its feature affinity is measured and
``partition_tables`` keeps the strongest pairs inside ``--towers`` towers planned for a
2 x 2 cluster), and with ``projection`` r4 over the statistics-only partition (balanced
costs, no affinity) and over a random partition of the learned towers' sizes (is the
partitioner at least as good as chance?). The towers' bar: mean AUC within 0.002 of
flat's.

Training is single-process: a towered model trains on any cluster exactly as it does
alone (the engine's towers are tested equal to the unsharded model, forward, gradients
and optimizer steps), so the AUC is the model's, not the sharding's. Within a seed every
run starts from the same seed and sees the same batches in the same order.

The data is the deterministic 80/20 split (split seed 0) of the 10,000-row sample; AUC
is computed once over all validation rows.

Usage::

    python benchmarks/towers_criteo_auc.py [--data PATH] [--seeds 0,1,2] [--towers 2]
        [--warmup-steps 60] [--epochs 1] [--batch-size 128] [--json out.json] [--smoke]

``--smoke`` (one seed, flat and one towered run, a few steps) keeps the script working
in the test suite.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import random
import statistics
import sys
import tempfile
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.data import DataLoader
from torchmetrics.functional.classification import binary_auroc
from torchrec.datasets.utils import Batch

from lightning_embark.data import CriteoDataset, criteo_spec
from lightning_embark.lists import parse_list
from lightning_embark.models import DLRMModule
from lightning_embark.plan import TowerModule, TowerRequest, save_towers
from lightning_embark.planner import (
    CostModel,
    FeatureAffinity,
    load_calibration,
    measure_affinity,
    partition_tables,
)
from lightning_embark.spec import ModelSpec
from lightning_embark.testing import quiet_trainer

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO.parent / "shared" / "data" / "criteo-autorec-train-10k.txt"
#: The bar: |mean AUC(towers) - mean AUC(flat)| <= this.
AUC_TOLERANCE = 0.002
SPLIT_SEED = 0
SMOKE_STEPS = 4
#: (label, tower module, ratio, partition) of every towered run; ``flat`` runs first.
VARIANTS: tuple[tuple[str, str, float, str], ...] = (
    ("projection r2", "projection", 2.0, "learned"),
    ("projection r4", "projection", 4.0, "learned"),
    ("dcn r2", "dcn", 2.0, "learned"),
    ("dcn r4", "dcn", 4.0, "learned"),
    ("projection r4, statistics-only", "projection", 4.0, "statistics"),
    ("projection r4, random towers", "projection", 4.0, "random"),
)


@dataclass(frozen=True, kw_only=True)
class Config:
    """What to train.

    Attributes:
        data: The Criteo file.
        seeds: Training seeds; the split stays fixed.
        towers: Towers the partitioner makes (planned for 2 hosts x 2 ranks).
        epochs: Passes over the training split.
        batch_size: Examples per step.
        num_embeddings: Hashed rows per table.
        embedding_dim: Width of every table.
        max_steps: Stop each run after this many steps (None: all epochs).
        warmup_steps: Steps of the flat warm-up run the learned partition reads.
        variants: The towered runs (labels of :data:`VARIANTS`).
    """

    data: str
    seeds: tuple[int, ...] = (0, 1, 2)
    towers: int = 2
    epochs: int = 1
    batch_size: int = 128
    num_embeddings: int = 20_000
    embedding_dim: int = 16
    max_steps: int | None = None
    warmup_steps: int = 60
    variants: tuple[str, ...] = tuple(v[0] for v in VARIANTS)


def partitioned(
    spec: ModelSpec,
    count: int,
    module: str,
    ratio: float,
    affinity: FeatureAffinity | None,
    seed: int,
) -> list[TowerRequest]:
    """The partitioner's towers (statistics-only without ``affinity``), for 2 hosts x 2
    ranks at batch 128."""
    model = CostModel(
        spec, load_calibration("emulated"), num_hosts=2, ranks_per_host=2, batch_size=128
    )
    return partition_tables(
        model, count, affinity=affinity, seed=seed, module=TowerModule(module), output_ratio=ratio
    )


def shuffled(towers: Sequence[TowerRequest], seed: int) -> list[TowerRequest]:
    """Towers of the same sizes, modules and widths over a random order of the tables."""
    tables = [t for tower in towers for t in tower.tables]
    random.Random(1000 + seed).shuffle(tables)
    out, start = [], 0
    for tower in towers:
        size = len(tower.tables)
        out.append(dataclasses.replace(tower, tables=tuple(tables[start : start + size])))
        start += size
    return out


def load_split(config: Config, split: str) -> CriteoDataset:
    """One split's batches (the training split drops its last partial batch)."""
    return CriteoDataset(
        config.data,
        num_embeddings=config.num_embeddings,
        batch_size=config.batch_size,
        split=split,
        val_fraction=0.2,
        seed=SPLIT_SEED,
        drop_last=split == "train",
    )


def train(
    config: Config,
    spec: ModelSpec,
    seed: int,
    towers: str | None,
    train: CriteoDataset,
    max_steps: int | None,
) -> DLRMModule:
    """One model trained from ``seed`` (``towers``: a towers.json)."""
    torch.manual_seed(seed)
    model = DLRMModule(
        spec,
        interaction="dot",
        dense_arch_layer_sizes=[64, config.embedding_dim],
        over_arch_layer_sizes=[64, 32, 1],
        dense_optimizer="adagrad",
        dense_lr=0.05,
        sparse_optimizer="rowwise_adagrad",
        sparse_lr=0.02,
        towers=towers,
    )
    trainer = quiet_trainer(
        max_epochs=config.epochs, max_steps=max_steps or -1, limit_val_batches=0
    )
    trainer.fit(model, DataLoader(train, batch_size=None))
    model.eval()
    return model


def train_auc(
    config: Config,
    spec: ModelSpec,
    seed: int,
    towers: str | None,
    data: tuple[CriteoDataset, list[Batch]],
) -> float:
    """Validation AUC over all rows after training one model (``towers``: a towers.json)."""
    train_split, val = data
    model = train(config, spec, seed, towers, train_split, config.max_steps)
    with torch.no_grad():
        logits = torch.cat([model(b.dense_features, b.sparse_features) for b in val])
    labels = torch.cat([b.labels for b in val]).int()
    return float(binary_auroc(torch.sigmoid(logits), labels))


def run(config: Config) -> dict[str, list[float]]:
    """AUC per seed of ``flat`` and every variant."""
    spec = criteo_spec(config.num_embeddings, config.embedding_dim)
    data = (load_split(config, "train"), list(load_split(config, "val")))
    chosen = [v for v in VARIANTS if v[0] in config.variants]
    aucs: dict[str, list[float]] = {"flat": [], **{v[0]: [] for v in chosen}}
    with tempfile.TemporaryDirectory(prefix="towers-auc-") as tmp:
        for seed in config.seeds:
            aucs["flat"].append(train_auc(config, spec, seed, None, data))
            warm = train(config, spec, seed, None, data[0], config.warmup_steps)
            affinity = measure_affinity(warm.model, iter(data[0]), source="warm-up")
            for label, module, ratio, partition in chosen:
                learned = partition in ("learned", "random")
                towers = partitioned(
                    spec, config.towers, module, ratio, affinity if learned else None, seed
                )
                if partition == "random":
                    towers = shuffled(towers, seed)
                path = Path(tmp) / "towers.json"
                save_towers(towers, path)
                aucs[label].append(train_auc(config, spec, seed, str(path), data))
            print(
                f"seed {seed}: " + ", ".join(f"{k} {v[-1]:.4f}" for k, v in aucs.items()),
                file=sys.stderr,
                flush=True,
            )
    return aucs


def format_table(aucs: dict[str, list[float]]) -> str:
    """Mean AUC per variant, the delta against flat, its standard error and the seeds.

    The standard error is that of the per-seed paired deltas (same seed, same batches),
    ``stdev(d) / sqrt(n)``: a delta within about two of it of zero is not resolved by
    this many seeds, whichever side of the bar it falls.
    """
    flat = statistics.mean(aucs["flat"])
    lines = [
        f"{'model':<32}{'mean AUC':>9}{'delta':>9}{'+-se':>8}{'within':>8}  per seed",
        "-" * 86,
    ]
    for label, values in aucs.items():
        mean = statistics.mean(values)
        deltas = [v - f for v, f in zip(values, aucs["flat"], strict=True)]
        se = statistics.stdev(deltas) / len(deltas) ** 0.5 if len(deltas) > 1 else 0.0
        delta = mean - flat
        within = "-" if label == "flat" else ("yes" if abs(delta) <= AUC_TOLERANCE else "no")
        error = "-" if label == "flat" or len(deltas) < 2 else f"{se:.4f}"
        seeds = " ".join(f"{v:.4f}" for v in values)
        lines.append(f"{label:<32}{mean:>9.4f}{delta:>+9.4f}{error:>8}{within:>8}  {seeds}")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(DEFAULT_DATA))
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--towers", type=int, default=2)
    parser.add_argument("--warmup-steps", type=int, default=60)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--json", default=None)
    parser.add_argument("--smoke", action="store_true")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if not Path(args.data).is_file():
        print(f"towers_criteo_auc: no data file {args.data!r}; pass --data", file=sys.stderr)
        return 2
    for name in ("lightning", "lightning.pytorch"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    config = Config(
        data=args.data,
        seeds=parse_list(args.seeds, int, what="--seeds"),
        towers=args.towers,
        warmup_steps=args.warmup_steps,
        epochs=args.epochs,
        batch_size=args.batch_size,
    )
    if args.smoke:
        config = dataclasses.replace(
            config,
            seeds=config.seeds[:1],
            max_steps=SMOKE_STEPS,
            warmup_steps=SMOKE_STEPS,
            variants=("projection r4",),
        )
    aucs = run(config)
    print(format_table(aucs))
    if args.json:
        Path(args.json).write_text(
            json.dumps({"config": dataclasses.asdict(config), "aucs": aucs}, indent=2)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
