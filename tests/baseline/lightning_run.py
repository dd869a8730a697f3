"""Train a tiny DLRM with ``Trainer(strategy=...)`` on CPU ranks; write what happened as JSON.

Run by ``test_strategy.py`` either directly (Lightning's own launcher re-runs this
script once per extra rank) or under ``torchrun`` (one process per rank, possibly one
torchrun per emulated node). Each rank writes ``<out>/rank<k>.json``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from lightning.pytorch import Callback
from torch.utils.data import DataLoader
from torchrec.distributed.embeddingbag import ShardedEmbeddingBagCollection

from lightning_embark._leave import leave_process_groups
from lightning_embark.baseline import plan_table_layout
from lightning_embark.models import EMBEDDING_PATH, DLRMModule
from lightning_embark.registry import register_strategies
from lightning_embark.testing import quiet_trainer
from lightning_embark.testing._ranks import load_module


def _synthetic():
    return load_module(
        Path(__file__).resolve().parents[1] / "models" / "synthetic.py", "_embark_test_synthetic"
    )


class _Losses(Callback):
    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.losses.append(float(outputs["loss"]))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", default="torchrec")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--num-nodes", type=int, default=1)
    parser.add_argument("--max-steps", type=int, default=16)
    parser.add_argument("--interaction", default="dot")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    register_strategies()
    synthetic = _synthetic()
    spec = synthetic.tiny_spec()
    world = args.devices * args.num_nodes
    train = synthetic.synthetic_batches(spec, num_batches=8 * world, batch_size=64, seed=0)
    val = synthetic.synthetic_batches(spec, num_batches=2 * world, batch_size=64, seed=1)
    torch.manual_seed(0)
    model = DLRMModule(
        spec,
        dense_arch_layer_sizes=[32, 16],
        over_arch_layer_sizes=[32, 1],
        interaction=args.interaction,
        dcn_num_layers=2,
        dcn_low_rank_dim=8,
        dense_lr=0.05,
        sparse_lr=0.05,
    )
    record = _Losses()
    trainer = quiet_trainer(
        strategy=args.strategy,
        devices=args.devices,
        num_nodes=args.num_nodes,
        max_steps=args.max_steps,
        callbacks=[record],
    )
    trainer.fit(
        model,
        DataLoader(synthetic.BatchDataset(train), batch_size=None),
        DataLoader(synthetic.BatchDataset(val), batch_size=None),
    )
    fit_metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    validated = trainer.validate(model, DataLoader(synthetic.BatchDataset(val), batch_size=None))
    strategy = trainer.strategy
    optimizer = trainer.optimizers[0]
    optimized = {id(p) for group in optimizer.param_groups for p in group["params"]}
    named = dict(model.named_parameters())
    result = {
        "rank": trainer.global_rank,
        "world_size": trainer.world_size,
        "losses": record.losses,
        "fit_metrics": fit_metrics,
        "validate_metrics": validated[0],
        "plan_summary": strategy.plan_summary(),
        "layout": plan_table_layout(strategy.plan),
        "topology": {
            "num_hosts": strategy.topology.num_hosts,
            "ranks_per_host": strategy.topology.ranks_per_host,
        },
        "embeddings_sharded": isinstance(
            model.embedding_modules()[EMBEDDING_PATH], ShardedEmbeddingBagCollection
        ),
        "optimizer": type(optimizer).__name__,
        "optimized_names": sorted(n for n, p in named.items() if id(p) in optimized),
        "fused_names": sorted(
            n for n, p in named.items() if hasattr(p, "_in_backward_optimizers")
        ),
        "qcomms_registry": strategy._dmp.sharders[0].qcomm_codecs_registry is not None,
        "fused_optimizer_lr": sorted({g["lr"] for g in strategy.fused_optimizer.param_groups}),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{trainer.global_rank}.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
    leave_process_groups()  # every rank, at a barrier, before the exit
