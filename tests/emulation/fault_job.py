"""One rank of a fault test: a tiny DLRM under ``strategy="embark"`` (its defaults: the
overlapped lane and the input pipeline), with a fault injected on request.

Launched by ``test_faults.py`` once per rank inside the emulated hosts' namespaces (no
torchrun: a launcher that stops every rank when one fails would hide what the survivors
do). Epoch ``e`` is batch ``e`` of the rank's own batches (one batch per epoch, so a run
resumed from an epoch's checkpoint sees the batches an uninterrupted run sees), and a
checkpoint is written every ``--every`` epochs.

Each rank writes ``rank{R}.json`` (its losses, and the error that ended it, if one did)
and, after a finished run, ``weights{R}.pt`` (its dense parameters and its embedding
blocks with their optimizer state). ``--die-at E`` makes rank ``--fault-rank`` SIGKILL
itself after epoch ``E``'s step (its backward's updates still on the lane) and write the
time first (``died.json``); ``--bad nan|ids`` puts a NaN in the dense features, or an ID
past its table's rows, into that rank's batch ``--bad-at``.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, Sampler

from lightning_embark.models import DLRMModule
from lightning_embark.plan import layouts
from lightning_embark.plan._types import ClusterPlan, ClusterType, Plan
from lightning_embark.registry import register_strategies
from lightning_embark.strategies import EmbarkStrategy
from lightning_embark.testing._ranks import load_module

synthetic = load_module(
    Path(__file__).resolve().parents[1] / "models" / "synthetic.py", "_embark_test_synthetic"
)


def plan(world: int, ranks_per_host: int) -> Plan:
    """Every kind of cluster, the RB and UB ones hierarchical across the hosts."""
    return Plan(
        world_size=world,
        ranks_per_host=ranks_per_host,
        clusters=(
            ClusterPlan(name="dp", type=ClusterType.DP),
            ClusterPlan(name="rb", type=ClusterType.RB, hierarchical=True),
            ClusterPlan(name="ub", type=ClusterType.UB, hierarchical=True),
        ),
        tables=(
            layouts.table_wise("f0", "rb", world - 1),
            layouts.column_wise("f1", "rb", range(world)),
            layouts.row_wise("f2", "ub", range(world)),
            layouts.data_parallel("f3", "dp", world),
        ),
    )


class EpochBatch(Sampler[int]):
    """Epoch ``e`` reads batch ``e`` (Lightning calls ``set_epoch`` before each epoch, a
    resumed run too)."""

    def __init__(self) -> None:
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Any:
        yield self.epoch

    def __len__(self) -> int:
        return 1


class Faults(Callback):
    """Records the losses; kills this rank after the step of epoch ``die_at``."""

    def __init__(self, *, die_at: int | None, out: Path) -> None:
        self.losses: list[float] = []
        self.die_at = die_at
        self.out = out

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.losses.append(float(outputs["loss"]))
        if self.die_at is not None and trainer.current_epoch == self.die_at:
            record = {"rank": trainer.global_rank, "epoch": self.die_at, "time": time.time()}
            (self.out / "died.json").write_text(json.dumps(record))
            os.kill(os.getpid(), signal.SIGKILL)  # its backward's updates still in flight


def spoiled(batch: Any, kind: str, spec: Any) -> Any:
    """``batch`` with a NaN in its dense features, or an ID one past its table's rows."""
    if kind == "nan":
        dense = batch.dense_features.clone()
        dense[0, 0] = float("nan")
        return type(batch)(dense, batch.sparse_features, batch.labels)
    kjt = batch.sparse_features
    values = kjt.values().clone()
    values[0] = spec.tables[0].num_embeddings  # the first ID is feature f0's
    spoilt = type(kjt)(keys=kjt.keys(), values=values, lengths=kjt.lengths())
    return type(batch)(batch.dense_features, spoilt, batch.labels)


def weights(model: DLRMModule, strategy: EmbarkStrategy) -> dict[str, torch.Tensor]:
    """The rank's dense parameters and its embedding blocks with their optimizer state."""
    out = {f"dense/{n}": p.detach().clone() for n, p in model.named_parameters()}
    for path, module in strategy.sharded_modules.items():
        for shard in module.local_shards():
            key = f"{path}/{shard.table}/{shard.replica}:{shard.row_shard}:{shard.col_shard}"
            out[f"{key}/weight"] = shard.weight.clone()
            if shard.optimizer_state is not None:
                out[f"{key}/state"] = shard.optimizer_state.clone()
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--every", type=int, default=1)
    parser.add_argument("--resume", type=Path, default=None)
    parser.add_argument("--fault-rank", type=int, default=1)
    parser.add_argument("--die-at", type=int, default=None)
    parser.add_argument("--bad", choices=("nan", "ids"), default=None)
    parser.add_argument("--bad-at", type=int, default=2)
    args = parser.parse_args()
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the test's hang report
    faulthandler.enable(all_threads=True)  # and every thread's stack on a crash (SIGABRT)
    torch.set_num_threads(1)
    register_strategies()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    ranks_per_host = int(os.environ["EMBARK_RANKS_PER_HOST"])
    spec = synthetic.tiny_spec(rows=80, dim=4)
    batches = synthetic.synthetic_batches(
        spec, num_batches=args.epochs, batch_size=8, seed=10 + rank
    )
    if args.bad is not None and rank == args.fault_rank:
        batches[args.bad_at] = spoiled(batches[args.bad_at], args.bad, spec)
    torch.manual_seed(0)
    model = DLRMModule(spec, dense_arch_layer_sizes=[4], over_arch_layer_sizes=[4, 1])
    faults = Faults(die_at=args.die_at if rank == args.fault_rank else None, out=args.out)
    checkpoints = ModelCheckpoint(
        dirpath=args.out / "checkpoints", save_top_k=-1, every_n_epochs=args.every
    )
    strategy = EmbarkStrategy(plan=plan(world, ranks_per_host))
    trainer = Trainer(
        accelerator="cpu",
        devices=ranks_per_host,
        num_nodes=world // ranks_per_host,
        strategy=strategy,
        max_epochs=args.epochs,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        use_distributed_sampler=False,
        callbacks=[faults, checkpoints],
    )
    loader = DataLoader(synthetic.BatchDataset(batches), batch_size=None, sampler=EpochBatch())
    record: dict[str, Any] = {"rank": rank, "error": None}
    try:
        trainer.fit(model, loader, ckpt_path=args.resume)
    except BaseException as error:
        record["error"] = {"type": type(error).__name__, "message": str(error)}
        record["failed_at"] = time.time()
        traceback.print_exc()
        raise
    else:
        torch.save(weights(model, strategy), args.out / f"weights{rank}.pt")
    finally:
        record["losses"] = faults.losses
        record["time"] = time.time()
        (args.out / f"rank{rank}.json").write_text(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
