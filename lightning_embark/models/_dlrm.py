"""DLRM and DLRM-DCNv2 as a LightningModule over torchrec's reference models.

The baseline every figure is measured against must be torchrec's own model, not a
re-implementation: this module wraps ``torchrec.models.dlrm.DLRM`` /
``DLRM_DCN`` and adds only what Lightning needs (loss, metrics, optimizers) plus the
:class:`~lightning_embark.models._protocol.ShardableModule` methods a sharding
strategy uses.

The embedding tables are created on the ``meta`` device, as in torchrec's examples,
so that a sharding strategy allocates only each rank's shards. Without such a
strategy, ``configure_model`` (or :meth:`DLRMModule.materialize_embeddings`) allocates
them on the CPU.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.nn.functional as F
from lightning.pytorch import LightningModule
from torch import nn
from torchmetrics.classification import BinaryAUROC
from torchrec.datasets.utils import Batch
from torchrec.models.dlrm import DLRM, DLRM_DCN
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.modules.embedding_tower import EmbeddingTowerCollection
from torchrec.optim.optimizers import in_backward_optimizer_filter
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from lightning_embark._traffic import traffic
from lightning_embark.errors import ConfigError, EmbarkError
from lightning_embark.models._dlrm_config import DLRMConfig
from lightning_embark.models._optimizers import ChainedOptimizer, SparseOptimizerSpec
from lightning_embark.models._tower_dlrm import TowerDLRM, tower_model
from lightning_embark.plan import load_towers
from lightning_embark.spec import ModelSpec

#: Where the embedding collection lives inside :class:`DLRMModule`.
EMBEDDING_PATH = "model.sparse_arch.embedding_bag_collection"
#: With towers: the flat features' collection and the tower collection.
FLAT_PATH = "model.flat"
TOWERS_PATH = "model.towers"


def _embedding_dim(spec: ModelSpec) -> int:
    dims = {t.embedding_dim for t in spec.tables}
    if len(dims) != 1:
        by_dim = {
            d: [t.name for t in spec.tables if t.embedding_dim == d][:3] for d in sorted(dims)
        }
        raise ConfigError(
            f"spec {spec.name!r}: DLRM needs one embedding dim for all tables (its "
            f"interaction concatenates them), got dims {sorted(dims)} (e.g. {by_dim}); "
            "use a spec with equal dims"
        )
    return dims.pop()


class DLRMModule(LightningModule):
    """torchrec DLRM (``interaction="dot"``) or DLRM-DCNv2 (``"dcn"``) for a model spec.

    Batches are ``torchrec.datasets.utils.Batch``: ``dense_features`` (B x
    num_dense_features), ``sparse_features`` (a KeyedJaggedTensor keyed by the spec's
    feature names) and ``labels`` (B,).

    All-categorical data (``num_dense_features=0``) is supported: the bottom MLP then
    reads a constant 1 per sample, so its output is one learned vector (a bias in the
    interaction's dense slot) and the prediction rests on the embeddings alone; the
    batches' ``dense_features`` may be empty (``B x 0``).

    Args:
        spec: Tables (one per feature) and number of dense features.
        config: Architecture and optimizers; None: MLPerf-like defaults.
        **overrides: :class:`DLRMConfig` fields replacing those of ``config``.

    Raises:
        ConfigError: tables of different widths, a bottom MLP not ending at the
            embedding width, or an invalid config field.
    """

    def __init__(
        self, spec: ModelSpec, *, config: DLRMConfig | None = None, **overrides: Any
    ) -> None:
        super().__init__()
        config = config or DLRMConfig()
        if overrides:
            unknown = sorted(set(overrides) - {f.name for f in dataclasses.fields(DLRMConfig)})
            if unknown:
                raise ConfigError(f"unknown DLRMConfig fields {unknown}")
            config = dataclasses.replace(config, **overrides)
        self.spec = spec
        dense_in = max(1, spec.num_dense_features)  # all-categorical: a constant input
        self.config = config
        dim = _embedding_dim(spec)
        self.save_hyperparameters({"spec": spec.to_dict(), "config": config.to_dict()})
        # A towers file without towers (the planner found flat cheaper) is the flat model.
        requests = [] if config.towers is None else load_towers(config.towers)
        if requests:
            self.model: DLRM | TowerDLRM = tower_model(
                spec.embedding_bag_configs(),
                requests,
                embedding_dim=dim,
                device=torch.device("meta"),
                dense_in_features=dense_in,
                dense_arch_layer_sizes=list(config.dense_layers(dim)),
                over_arch_layer_sizes=list(config.over_arch_layer_sizes),
                interaction=config.interaction,
                dcn_num_layers=config.dcn_num_layers,
                dcn_low_rank_dim=config.dcn_low_rank_dim,
            )
            self.val_auc = BinaryAUROC()
            return
        ebc = EmbeddingBagCollection(
            tables=spec.embedding_bag_configs(), device=torch.device("meta")
        )
        common = dict(
            embedding_bag_collection=ebc,
            dense_in_features=dense_in,
            dense_arch_layer_sizes=list(config.dense_layers(dim)),
            over_arch_layer_sizes=list(config.over_arch_layer_sizes),
            dense_device=torch.device("cpu"),
        )
        if config.interaction == "dcn":
            self.model = DLRM_DCN(
                **common,
                dcn_num_layers=config.dcn_num_layers,
                dcn_low_rank_dim=config.dcn_low_rank_dim,
            )
        else:
            self.model = DLRM(**common)
        self.val_auc = BinaryAUROC()

    # --- ShardableModule ---------------------------------------------------------

    def embedding_modules(self) -> dict[str, nn.Module]:
        """Path -> embedding collection (sharded after a sharding strategy's setup); with
        towers, the flat collection (if any) and the tower collection."""
        if isinstance(self.model, TowerDLRM):
            found = {TOWERS_PATH: self.model.towers}
            return {FLAT_PATH: self.model.flat, **found} if self.model.flat is not None else found
        return {EMBEDDING_PATH: self.model.sparse_arch.embedding_bag_collection}

    def _tables(self) -> list[EmbeddingBagCollection]:
        """The unsharded collections that hold tables (towers' included)."""
        out = []
        for module in self.embedding_modules().values():
            if isinstance(module, EmbeddingBagCollection):
                out.append(module)
            elif isinstance(module, EmbeddingTowerCollection):
                out += [t.embedding for t in module.towers]
        return out

    def sparse_optimizer_spec(self) -> SparseOptimizerSpec:
        """The embedding optimizer; fused into the TBE backward when sharded."""
        return self.config.sparse_optimizer_spec()

    def _embedding_parameter_ids(self) -> set[int]:
        """The tables' parameters, whatever holds them (torchrec's or a strategy's sharded
        modules); tower modules are dense parameters, not tables."""
        ids: set[int] = set()
        for module in self.embedding_modules().values():
            if isinstance(module, EmbeddingTowerCollection):
                dense = [p for t in module.towers for p in t.interaction.parameters()]
            else:
                # A sharded collection's tower modules: the engine's keeps them in
                # ``towers``, torchrec's ShardedEmbeddingTowerCollection in ``interactions``.
                towers = getattr(module, "towers", None)
                if not isinstance(towers, nn.Module):
                    towers = getattr(module, "interactions", None)
                dense = list(towers.parameters()) if isinstance(towers, nn.Module) else []
            ids |= {id(p) for p in module.parameters()} - {id(p) for p in dense}
        return ids

    def _trainable_parameters(self) -> list[tuple[str, nn.Parameter]]:
        """``named_parameters()`` and those of embedding modules hidden from it.

        torchrec's ``ShardedEmbeddingTowerCollection`` answers ``named_modules()`` with
        itself alone, so ``named_parameters()`` of any module above it sees none of its
        parameters, tower modules included; its own ``named_parameters()`` lists them.
        """
        found = list(self.named_parameters())
        seen = {id(p) for _, p in found}
        for path, module in self.embedding_modules().items():
            for name, param in module.named_parameters(prefix=path):
                if id(param) not in seen:
                    seen.add(id(param))
                    found.append((name, param))
        return found

    # --- embedding allocation ----------------------------------------------------

    def embeddings_on_meta(self) -> bool:
        """Whether the (unsharded) tables are still unallocated."""
        return any(p.is_meta for ebc in self._tables() for p in ebc.parameters())

    def materialize_embeddings(self) -> None:
        """Allocate and initialize the tables on the CPU (single-process training).

        A fresh collection replaces the meta one: torchrec's ``reset_parameters`` skips
        a collection created on ``meta`` even after ``to_empty``.
        """
        if not self.embeddings_on_meta():
            return
        cpu = torch.device("cpu")
        if isinstance(self.model, TowerDLRM):
            flat = self.model.flat
            if flat is not None:
                self.model.flat = EmbeddingBagCollection(
                    tables=flat.embedding_bag_configs(), device=cpu
                )
            for tower in self.model.towers.towers:
                tower.embedding = EmbeddingBagCollection(
                    tables=tower.embedding.embedding_bag_configs(), device=cpu
                )
            return
        self.model.sparse_arch.embedding_bag_collection = EmbeddingBagCollection(
            tables=self.spec.embedding_bag_configs(), device=cpu
        )

    def configure_model(self) -> None:
        """Allocate the tables unless the trainer's strategy will shard them."""
        if not getattr(self.trainer.strategy, "shards_embeddings", False):
            self.materialize_embeddings()

    # --- forward, steps ----------------------------------------------------------

    def forward(
        self, dense_features: torch.Tensor, sparse_features: KeyedJaggedTensor
    ) -> torch.Tensor:
        """Logits of shape (B,)."""
        if self.embeddings_on_meta():
            raise EmbarkError(
                "DLRMModule's embedding tables are not allocated yet (meta device): train it "
                "with a Trainer, or call materialize_embeddings() before calling the module"
            )
        if self.spec.num_dense_features == 0:
            dense_features = torch.ones(sparse_features.stride(), 1, device=dense_features.device)
        return self.model(dense_features, sparse_features).squeeze(-1)

    def batch_loss(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """BCE-with-logits loss of a batch and its logits: the training step's computation,
        which a strategy that drives the step itself (torchrec's train pipeline,
        ``TorchrecStrategy(pipeline=True)``) runs in its place."""
        logits = self(batch.dense_features, batch.sparse_features)
        return F.binary_cross_entropy_with_logits(logits, batch.labels.float()), logits

    def training_step(self, batch: Batch, batch_idx: int) -> torch.Tensor:
        """BCE-with-logits loss of this rank's batch; logs ``train_loss``, the global
        batch's (see :meth:`global_mean`)."""
        loss, _ = self.batch_loss(batch)
        self.log_train_loss(loss, batch)
        return loss

    def log_train_loss(self, loss: torch.Tensor, batch: Batch) -> None:
        """Log ``train_loss``: the global batch's mean of this rank's ``loss`` on ``batch``
        (see :meth:`global_mean`)."""
        batch_size = batch.labels.numel()
        train_loss = self.global_mean(loss, batch_size)
        self.log("train_loss", train_loss, prog_bar=True, batch_size=batch_size)

    def global_mean(self, mean: torch.Tensor, count: int) -> torch.Tensor:
        """The mean over every rank's samples of a per-rank mean ``mean`` over ``count``
        samples: ``sum_r count_r * mean_r / sum_r count_r``.

        So the logged loss is the global batch's whatever the split: 4 ranks of 32 and 2
        of 64 over the same samples log the same curve, where rank 0's own loss (what
        Lightning logs unsynced) would not, and a mean of the ranks' means
        (``sync_dist=True``) would weigh a short last batch like a full one. One
        all-reduce of two numbers, through the strategy (so also on a single process,
        where it returns ``mean``), labelled ``metrics`` for byte accounting.
        """
        # The count filled in on the device: a tensor of Python data would be a host-to-device
        # copy, which on a GPU waits for the stream every step.
        totals = torch.stack(
            [mean.detach().float() * count, torch.full((), float(count), device=mean.device)]
        )
        if self._trainer is None:
            return totals[0] / totals[1]
        with traffic("metrics"):
            totals = self.trainer.strategy.reduce(totals, reduce_op="sum")
        return totals[0] / totals[1]

    def validation_step(self, batch: Batch, batch_idx: int) -> torch.Tensor:
        """Logs ``val_loss`` (mean over ranks) and ``val_auc`` (over the whole epoch)."""
        loss, logits = self.batch_loss(batch)
        batch_size = batch.labels.numel()
        self.val_auc.update(torch.sigmoid(logits.detach()), batch.labels.int())
        self.log("val_loss", loss, prog_bar=True, sync_dist=True, batch_size=batch_size)
        self.log("val_auc", self.val_auc, prog_bar=True, batch_size=batch_size)
        return loss

    def predict_step(self, batch: Batch, batch_idx: int) -> torch.Tensor:
        """Click probabilities of shape (B,)."""
        return torch.sigmoid(self(batch.dense_features, batch.sparse_features))

    # --- optimizers --------------------------------------------------------------

    def configure_optimizers(self) -> torch.optim.Optimizer:
        """The dense optimizer, chained with the sparse one for embeddings it must step.

        Embedding weights updated in backward (torchrec's fused TBE, marked with
        ``_in_backward_optimizers``) are left out. Embedding weights that are not, i.e.
        every table in single-process training and data-parallel tables under
        torchrec, get the sparse optimizer here, so the same algorithm and
        hyper-parameters apply to every table whatever the sharding.
        """
        embedding_ids = self._embedding_parameter_ids()
        dense: list[nn.Parameter] = []
        sparse: list[nn.Parameter] = []
        for _, param in in_backward_optimizer_filter(self._trainable_parameters()):
            if not param.requires_grad:
                continue
            (sparse if id(param) in embedding_ids else dense).append(param)
        dense_optimizer = self.config.dense_optimizer_spec().build(dense)
        if not sparse:
            return dense_optimizer
        return ChainedOptimizer([dense_optimizer, self.sparse_optimizer_spec().build(sparse)])
