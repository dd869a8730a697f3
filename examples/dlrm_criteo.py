"""Recipe: torchrec DLRM / DLRM-DCNv2 on a Criteo file with ``LightningCLI``, any strategy.

::

    python examples/dlrm_criteo.py fit --data.path ../shared/data/criteo-autorec-train-10k.txt \\
        --trainer.strategy embark --trainer.devices 2

    # data parallel (the tables replicated and all-reduced like every other weight)
    python examples/dlrm_criteo.py fit --data.path FILE --trainer.strategy ddp --trainer.devices 2
    # torchrec's DistributedModelParallel, fp32 or fp16 comms
    python examples/dlrm_criteo.py fit --data.path FILE --trainer.strategy torchrec \
        --trainer.devices 2
    # DLRM-DCNv2 instead of DLRM's dot interaction
    python examples/dlrm_criteo.py fit --data.path FILE --model.interaction dcn
    # every host of a multi-host job (here the emulated 2 hosts x 2 ranks: embark-cluster run ...)
    torchrun --nnodes 2 --nproc-per-node 2 ... examples/dlrm_criteo.py fit --data.path FILE \\
        --trainer.strategy embark --trainer.num_nodes 2 --trainer.devices 2

``--data`` is :class:`~lightning_embark.data.CriteoDataModule`: the file is
streamed, split 80/20 into train and validation by a stable hash of the line number,
and cut into per-rank batches so that N ranks with ``--data.batch_size B`` train on the
global batches one process with ``B x N`` would see. ``--model`` is :class:`CriteoDLRM`:
torchrec's ``DLRM`` (``--model.interaction dot``) or ``DLRM_DCN`` (``dcn``) over 26 hashed
tables (``--data.num_embeddings`` rows each, linked to the model). Validation AUC
(``val_auc``, over every validation line, all ranks' predictions together) and
``val_loss`` are logged after each epoch and printed at the end.

``import lightning_embark`` registers ``--trainer.strategy embark``, ``torchrec`` and
``torchrec-fp16``; ``ddp`` is Lightning's own. Checkpoints are off by default
(``enable_checkpointing=False``); ``--trainer.enable_checkpointing true`` turns them on with
a strategy that supports them.

``--report_dir DIR`` makes every rank write ``DIR/rank{R}.json`` after training: where it
ran (rank, world size, node rank, local rank), every step's loss and time and bytes sent
(``CommAccountingCallback``), and the validation metrics. Benchmarks and tests read it;
its step fields are those of ``embark-bench``'s per-rank records (docs/cli.md).
"""

from __future__ import annotations

import json
import math
import os
import resource
import sys
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

import lightning_embark  # noqa: F401  (registers strategy="embark", "torchrec", "torchrec-fp16")
from lightning_embark.accounting import CommAccountingCallback
from lightning_embark.data import DEFAULT_EMBEDDING_DIM, CriteoDataModule, criteo_spec
from lightning_embark.models import DLRMConfig, DLRMModule
from lightning_embark.topology import ranks_per_host_from_env

#: Rows per hashed table unless ``--data.num_embeddings`` says otherwise: few collisions on
#: the 10k-line sample, ~33 MB of tables, fast on a CPU.
RECIPE_NUM_EMBEDDINGS = 20_000
#: Examples per rank per step unless ``--data.batch_size`` says otherwise.
RECIPE_BATCH_SIZE = 128

TRAINER_DEFAULTS: dict[str, Any] = {
    "accelerator": "cpu",
    "devices": 1,
    "max_epochs": 1,
    # Off unless asked for (--trainer.enable_checkpointing true), so the recipe runs with
    # every strategy, including those that cannot save checkpoints.
    "enable_checkpointing": False,
    # The datamodule shards the stream per rank itself (IterableDataset).
    "use_distributed_sampler": False,
    "num_sanity_val_steps": 0,
    "log_every_n_steps": 10,
}


class CriteoDLRM(DLRMModule):
    """torchrec DLRM or DLRM-DCNv2 over the 26 hashed Criteo tables (C1..C26) and 13 dense
    features.

    Args:
        num_embeddings: Rows per table (linked to ``--data.num_embeddings``).
        embedding_dim: Width of every table.
        interaction: ``"dot"`` (DLRM) or ``"dcn"`` (DLRM-DCNv2 cross network).
        dense_arch_layer_sizes: Bottom MLP widths, ending at ``embedding_dim``; None:
            ``(64, embedding_dim)``.
        over_arch_layer_sizes: Top MLP widths, ending at 1.
        dcn_num_layers: Cross layers (``dcn`` only).
        dcn_low_rank_dim: Rank of each cross layer (``dcn`` only).
        dense_optimizer: ``"adagrad"`` or ``"adam"`` for the MLPs.
        dense_lr: Their learning rate.
        sparse_optimizer: ``"rowwise_adagrad"``, ``"adagrad"`` or ``"sgd"`` for the tables
            (fused into the backward when a strategy shards them).
        sparse_lr: Their learning rate.
        eps: Adagrad/Adam epsilon.
    """

    def __init__(
        self,
        num_embeddings: int = RECIPE_NUM_EMBEDDINGS,
        embedding_dim: int = DEFAULT_EMBEDDING_DIM,
        interaction: str = "dot",
        dense_arch_layer_sizes: tuple[int, ...] | None = None,
        over_arch_layer_sizes: tuple[int, ...] = (64, 32, 1),
        dcn_num_layers: int = 2,
        dcn_low_rank_dim: int = 64,
        dense_optimizer: str = "adagrad",
        dense_lr: float = 0.05,
        sparse_optimizer: str = "rowwise_adagrad",
        sparse_lr: float = 0.02,
        eps: float = 1e-8,
    ) -> None:
        config = DLRMConfig(
            dense_arch_layer_sizes=tuple(dense_arch_layer_sizes or (64, embedding_dim)),
            over_arch_layer_sizes=tuple(over_arch_layer_sizes),
            interaction=interaction,
            dcn_num_layers=dcn_num_layers,
            dcn_low_rank_dim=dcn_low_rank_dim,
            dense_optimizer=dense_optimizer,
            dense_lr=dense_lr,
            sparse_optimizer=sparse_optimizer,
            sparse_lr=sparse_lr,
            eps=eps,
        )
        super().__init__(criteo_spec(num_embeddings, embedding_dim), config=config)


class RankReport(Callback):
    """Writes ``rank{R}.json`` into ``out_dir`` after fitting: placement, losses, step times,
    metrics.

    Args:
        out_dir: Folder (created if missing).
        accounting: The run's :class:`CommAccountingCallback`, whose per-step times and
            bytes go into the record.
    """

    def __init__(self, out_dir: str | Path, accounting: CommAccountingCallback) -> None:
        self.out_dir = Path(out_dir)
        self.accounting = accounting
        self.losses: list[float] = []

    def on_train_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        self.losses.append(float(outputs["loss"]))

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        world = trainer.world_size
        steps = self.accounting.steps
        metrics = {
            k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val_")
        }
        strategy = trainer.strategy
        # ``Trainer.datamodule`` is assigned by Lightning's data connector, unannotated.
        datamodule = trainer.datamodule  # type: ignore[attr-defined]
        record = {
            "rank": trainer.global_rank,
            "world_size": world,
            "node_rank": trainer.node_rank,
            "local_rank": trainer.local_rank,
            "num_nodes": trainer.num_nodes,
            "num_devices": trainer.num_devices,
            "host": trainer.global_rank
            // ranks_per_host_from_env(world, default=trainer.num_devices),
            "torchrun_group_rank": os.environ.get("GROUP_RANK"),
            "strategy": type(strategy).__name__,
            "global_step": trainer.global_step,
            "losses": self.losses,
            "all_losses_finite": all(math.isfinite(x) for x in self.losses),
            "batch_size": getattr(datamodule, "batch_size", None),
            "step_seconds": [s.seconds for s in steps],
            "embedding_share": [s.embedding_comm_share for s in steps],
            "comm": [s.comm.to_dict() for s in steps],
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "validation": metrics,
        }
        plan_summary = getattr(strategy, "plan_summary", None)
        if callable(plan_summary):
            record["plan_summary"] = plan_summary()
        self.out_dir.mkdir(parents=True, exist_ok=True)
        (self.out_dir / f"rank{trainer.global_rank}.json").write_text(json.dumps(record))


class RecipeCLI(LightningCLI):
    """``LightningCLI`` for :class:`CriteoDLRM` on :class:`CriteoDataModule`, plus
    ``--report_dir``."""

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.set_defaults(
            {"data.batch_size": RECIPE_BATCH_SIZE, "data.num_embeddings": RECIPE_NUM_EMBEDDINGS}
        )
        parser.link_arguments("data.num_embeddings", "model.num_embeddings")
        parser.add_argument(
            "--report_dir",
            type=str | None,
            default=None,
            help="every rank writes rank{R}.json here after fit (placement, losses, step times, "
            "bytes)",
        )

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        trainer = super().instantiate_trainer(**kwargs)
        # Ranks of one machine share its cores; one rank per core keeps them from thrashing.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, trainer.num_devices)))
        report_dir = self._get(self.config_init, "report_dir")
        if report_dir:
            accounting = CommAccountingCallback(log=False)
            # ``Trainer.callbacks`` is assigned by Lightning's callback connector, unannotated.
            trainer.callbacks.extend(  # type: ignore[attr-defined]
                [accounting, RankReport(report_dir, accounting)]
            )
        return trainer

    def after_fit(self) -> None:
        metrics = {
            k: float(v) for k, v in self.trainer.callback_metrics.items() if k.startswith("val_")
        }
        if self.trainer.is_global_zero and metrics:
            shown = ", ".join(f"{k} {v:.4f}" for k, v in sorted(metrics.items()))
            print(
                f"[dlrm_criteo] {self.trainer.global_step} steps on {self.trainer.world_size} "
                f"rank(s): {shown}",
                flush=True,
            )


def main(args: list[str] | None = None, *, run: bool = True) -> RecipeCLI:
    """Build (and with ``run``, execute) the CLI; ``args`` replaces ``sys.argv[1:]``."""
    return RecipeCLI(
        CriteoDLRM,
        CriteoDataModule,
        trainer_defaults=TRAINER_DEFAULTS,
        seed_everything_default=0,
        save_config_kwargs={"overwrite": True},
        args=args,
        run=run,
    )


if __name__ == "__main__":
    main()
    sys.exit(0)
