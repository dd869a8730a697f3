"""Recipe: torchrec DLRM / DLRM-DCNv2 on any delimited CTR file with ``LightningCLI``, any
strategy.

::

    # Criteo DAC / 1TB (the defaults read a Criteo file)
    python examples/dlrm_ctr.py fit --data.path ../shared/data/criteo-autorec-train-10k.txt \\
        --trainer.strategy embark --trainer.devices 2

    # any CSV: a header, a 0/1 label column, two dense columns, every other column categorical
    python examples/dlrm_ctr.py fit --data.path clicks.csv --data.delimiter , \\
        --data.header true --data.label clicked --data.dense price,age \\
        --data.categorical_encoding string --trainer.strategy embark --trainer.devices 2
    # a positional libFM file (``label index:1 index:1 ...``, labels 1 / -1), e.g. Frappe's
    python examples/dlrm_ctr.py fit --data.path ../shared/data/frappe-nfm-validation.libfm \
        --data.delimiter ' ' --data.dense '[]' --data.categorical_encoding libfm \
        --data.label_threshold 0.5 --data.num_embeddings 5382
    # or the same options in a YAML file (``data: {path: ..., delimiter: ",", ...}``)
    python examples/dlrm_ctr.py fit --config ctr.yaml

    # click probabilities for every line of a file, in file order, to a CSV
    python examples/dlrm_ctr.py predict --config ctr.yaml --data.predict_path new.csv \\
        --ckpt_path CHECKPOINT --predictions predictions.csv

    # data parallel, torchrec's DistributedModelParallel, DLRM-DCNv2
    python examples/dlrm_ctr.py fit --data.path FILE --trainer.strategy ddp --trainer.devices 2
    python examples/dlrm_ctr.py fit --data.path FILE --trainer.strategy torchrec \\
        --trainer.devices 2
    python examples/dlrm_ctr.py fit --data.path FILE --model.interaction dcn
    # every host of a multi-host job (here the emulated 2 hosts x 2 ranks: embark-cluster run ...)
    torchrun --nnodes 2 --nproc-per-node 2 ... examples/dlrm_ctr.py fit --data.path FILE \\
        --trainer.strategy embark --trainer.num_nodes 2 --trainer.devices 2

``--data`` is :class:`~lightning_embark.data.DelimitedDataModule`: the file's layout
(``--data.delimiter``, ``--data.header``, ``--data.label``, ``--data.dense``,
``--data.categorical``, default every other column) with Criteo's as defaults
(:data:`CRITEO_DEFAULTS`); the file is streamed, split 80/20 into train and validation by
a stable hash of the line number, and cut into per-rank batches so that N ranks with
``--data.batch_size B`` train on the global batches one process with ``B x N`` would see.
A list option takes a comma list (``--data.dense price,age``) as it takes brackets
(``--data.dense '[price, age]'``), :func:`lightning_embark.lists.comma_lists`.
``--model`` is :class:`CTRDLRM`: torchrec's ``DLRM`` (``--model.interaction dot``) or
``DLRM_DCN`` (``dcn``) with one hashed table per categorical column
(``--data.num_embeddings`` rows each) and the file's dense width, both taken from the
data module. Validation AUC (``val_auc``, over every validation line, all ranks'
predictions together) and ``val_loss`` are logged after each epoch and printed at the end.

``predict`` writes ``label,probability`` for every line of ``--data.predict_path``
(default ``--data.path``; the same layout, labels included) in file order to
``--predictions`` (default ``predictions.csv`` in ``--trainer.default_root_dir``), on
any number of ranks.

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
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import BasePredictionWriter
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

import lightning_embark  # noqa: F401  (registers strategy="embark", "torchrec", "torchrec-fp16")
from lightning_embark.accounting import CommAccountingCallback
from lightning_embark.data import DEFAULT_EMBEDDING_DIM, DelimitedDataModule, ctr_spec
from lightning_embark.lists import comma_lists
from lightning_embark.models import DLRMConfig, DLRMModule
from lightning_embark.topology import ranks_per_host_from_env

#: Rows per hashed table unless ``--data.num_embeddings`` says otherwise: few collisions on
#: the 10k-line Criteo sample, ~33 MB of Criteo's 26 tables, fast on a CPU.
RECIPE_NUM_EMBEDDINGS = 20_000
#: Examples per rank per step unless ``--data.batch_size`` says otherwise.
RECIPE_BATCH_SIZE = 128
#: The ``--data`` defaults: a Criteo DAC / 1TB file (``label, I1..I13, C1..C26``, tabs, no
#: header, categories as 8 hex digits), so a Criteo file needs only ``--data.path``.
CRITEO_DEFAULTS: dict[str, Any] = {
    "data.delimiter": "\t",
    "data.header": False,
    "data.label": 0,
    "data.dense": list(range(1, 14)),
    "data.categorical": None,
    "data.categorical_encoding": "hex32",
    "data.batch_size": RECIPE_BATCH_SIZE,
    "data.num_embeddings": RECIPE_NUM_EMBEDDINGS,
}

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


class CTRDLRM(DLRMModule):
    """torchrec DLRM or DLRM-DCNv2 over one hashed table per categorical column.

    Args:
        tables: Feature -> rows of its table (linked to the data module's
            ``table_rows``).
        num_dense_features: Dense inputs per example, 0 for all-categorical data
            (linked to the data module's).
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
        materialize_tables: Allocate and initialise the tables here, from the seed,
            instead of leaving them on the ``meta`` device for the strategy. Single
            process, ``ddp`` and ``embark`` on any number of ranks then start from the
            same weights (embark slices rank 0's tables), at the cost of one full copy
            of the tables per rank while it shards them.
    """

    def __init__(
        self,
        tables: dict[str, int],
        num_dense_features: int,
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
        materialize_tables: bool = False,
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
        spec = ctr_spec(tables, num_dense_features=num_dense_features, embedding_dim=embedding_dim)
        super().__init__(spec, config=config)
        if materialize_tables:
            self.materialize_embeddings()


class PredictionWriter(BasePredictionWriter):
    """Writes ``label,probability`` per example of the predict file, in file order, to one
    CSV (from global rank 0).

    Rank r's b-th batch is the r-th slice of the b-th global batch (the data module's
    sharding rule), so gathering every rank's batches and reading them batch by batch,
    rank by rank restores the file's order. The predictions are held in memory until the
    end of the pass (4 bytes per example and label).

    Args:
        path: The CSV; None: ``predictions.csv`` in the Trainer's ``default_root_dir``.
    """

    def __init__(self, path: str | Path | None = None) -> None:
        super().__init__(write_interval="batch")
        self.path = None if path is None else Path(path)
        self.written: Path | None = None
        self.num_written = 0
        self._batches: list[tuple[list[float], list[float]]] = []

    def on_predict_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._batches = []
        # Lightning looks for a sampler's batch indices for every prediction writer; this
        # one restores the file's order from the sharding rule and needs none.
        warnings.filterwarnings("ignore", message="Couldn't infer the batch indices")

    def write_on_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        prediction: Any,
        batch_indices: Sequence[int] | None,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int,
    ) -> None:
        self._batches.append((batch.labels.tolist(), prediction.detach().float().tolist()))

    def on_predict_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        per_rank: list[Any] = [self._batches]
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            per_rank = [None] * dist.get_world_size()
            dist.all_gather_object(per_rank, self._batches)
        if not trainer.is_global_zero:
            return
        counts = {len(batches) for batches in per_rank}
        assert len(counts) == 1, f"ranks ran different numbers of predict steps: {counts}"
        path = self.path or Path(trainer.default_root_dir) / "predictions.csv"
        path.parent.mkdir(parents=True, exist_ok=True)
        rows = 0
        with path.open("w") as out:
            out.write("label,probability\n")
            for step in range(counts.pop()):
                for batches in per_rank:
                    labels, probabilities = batches[step]
                    out.writelines(
                        f"{label:g},{p:.8g}\n"
                        for label, p in zip(labels, probabilities, strict=True)
                    )
                    rows += len(labels)
        self.written, self.num_written = path, rows


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
    """``LightningCLI`` for :class:`CTRDLRM` on :class:`DelimitedDataModule` (Criteo's layout
    by default), plus ``--report_dir`` and ``--predictions``.

    Args:
        *args: As :class:`LightningCLI`.
        name: How the recipe names itself in what it prints.
        **kwargs: As :class:`LightningCLI`.
    """

    def __init__(self, *args: Any, name: str = "dlrm_ctr", **kwargs: Any) -> None:
        self.name = name
        self.writer: PredictionWriter | None = None
        super().__init__(*args, **kwargs)

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.set_defaults(CRITEO_DEFAULTS)
        # The model's tables and dense width are the data's, after the data module has
        # read the file's header (or first line).
        parser.link_arguments("data.table_rows", "model.tables", apply_on="instantiate")
        parser.link_arguments(
            "data.num_dense_features", "model.num_dense_features", apply_on="instantiate"
        )
        parser.add_argument(
            "--report_dir",
            type=str | None,
            default=None,
            help="every rank writes rank{R}.json here after fit (placement, losses, step times, "
            "bytes)",
        )
        parser.add_argument(
            "--predictions",
            type=str | None,
            default=None,
            help="predict writes label,probability per line of --data.predict_path (default "
            "--data.path), in file order, to this CSV (default: predictions.csv in "
            "--trainer.default_root_dir)",
        )

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        """As :class:`LightningCLI`, with comma lists: ``--data.dense price,age`` is
        ``--data.dense '[price, age]'`` (:func:`lightning_embark.lists.comma_lists`)."""
        if args is None:  # the command line (LightningCLI warns when args repeat it)
            self.config = parser.parse_args(comma_lists(parser, sys.argv[1:]))
        elif isinstance(args, (list, tuple)):
            super().parse_arguments(parser, comma_lists(parser, args))
        else:
            super().parse_arguments(parser, args)

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        trainer = super().instantiate_trainer(**kwargs)
        # Ranks of one machine share its cores; one rank per core keeps them from thrashing.
        # OMP_NUM_THREADS, when set, decides instead (as in Lightning's launchers).
        if "OMP_NUM_THREADS" not in os.environ:
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, trainer.num_devices)))
        # ``Trainer.callbacks`` is assigned by Lightning's callback connector, unannotated.
        callbacks = trainer.callbacks  # type: ignore[attr-defined]
        self.writer = PredictionWriter(self._get(self.config_init, "predictions"))
        callbacks.append(self.writer)
        report_dir = self._get(self.config_init, "report_dir")
        if report_dir:
            accounting = CommAccountingCallback(log=False)
            callbacks.extend([accounting, RankReport(report_dir, accounting)])
        return trainer

    def after_fit(self) -> None:
        metrics = {
            k: float(v) for k, v in self.trainer.callback_metrics.items() if k.startswith("val_")
        }
        if self.trainer.is_global_zero and metrics:
            shown = ", ".join(f"{k} {v:.4f}" for k, v in sorted(metrics.items()))
            print(
                f"[{self.name}] {self.trainer.global_step} steps on {self.trainer.world_size} "
                f"rank(s): {shown}",
                flush=True,
            )

    def after_predict(self) -> None:
        writer = self.writer
        if self.trainer.is_global_zero and writer is not None and writer.written is not None:
            print(
                f"[{self.name}] {writer.num_written} predictions on {self.trainer.world_size} "
                f"rank(s) written to {writer.written}",
                flush=True,
            )


def main(args: list[str] | None = None, *, run: bool = True, name: str = "dlrm_ctr") -> RecipeCLI:
    """Build (and with ``run``, execute) the CLI; ``args`` replaces ``sys.argv[1:]``."""
    return RecipeCLI(
        CTRDLRM,
        DelimitedDataModule,
        name=name,
        trainer_defaults=TRAINER_DEFAULTS,
        seed_everything_default=0,
        save_config_kwargs={"overwrite": True},
        args=args,
        run=run,
    )


if __name__ == "__main__":
    main()
    sys.exit(0)
