"""DLRMModule without a sharding strategy: config checks, optimizers, plain Lightning training."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist
from lightning.pytorch import Callback
from lightning.pytorch.loggers import Logger
from torch.distributed.optim import _apply_optimizer_in_backward
from torch.utils.data import DataLoader
from torchrec.models.dlrm import DLRM_DCN
from torchrec.optim import RowWiseAdagrad

from lightning_embark.errors import ConfigError, EmbarkError
from lightning_embark.models import EMBEDDING_PATH, ChainedOptimizer, DLRMConfig, DLRMModule
from lightning_embark.spec import ModelSpec, TableSpec
from lightning_embark.testing import quiet_trainer, run_gloo_ranks
from lightning_embark.testing._tolerance import U

SMALL = dict(
    dense_arch_layer_sizes=[32, 16],
    over_arch_layer_sizes=[32, 1],
    dcn_num_layers=2,
    dcn_low_rank_dim=8,
)


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"over_arch_layer_sizes": [8, 2]}, "end with 1"),
        ({"over_arch_layer_sizes": []}, "non-empty"),
        ({"interaction": "cross"}, "interaction"),
        ({"dcn_num_layers": 0}, "dcn_num_layers"),
        ({"sparse_optimizer": "lamb"}, "sparse_optimizer"),
        ({"dense_optimizer": "sgd"}, "dense_optimizer"),
        ({"dense_lr": 0.0}, "dense optimizer 'adagrad': lr"),
        ({"eps": -1.0}, "eps"),
    ],
)
def test_config_rejects(fields: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        DLRMConfig(**fields)


def test_config_defaults_are_mlperf_like() -> None:
    config = DLRMConfig()
    assert config.dense_layers(128) == (512, 256, 128)
    assert config.over_arch_layer_sizes == (1024, 1024, 512, 256, 1)
    assert (config.dense_optimizer, config.sparse_optimizer) == ("adagrad", "rowwise_adagrad")
    assert config.sparse_optimizer_spec().fused_params()["learning_rate"] == config.sparse_lr


def test_module_rejects_specs_dlrm_cannot_run(synthetic) -> None:
    mixed = ModelSpec(
        name="mixed",
        tables=(
            TableSpec(name="a", num_embeddings=10, embedding_dim=8, pooling_factor=1.0),
            TableSpec(name="b", num_embeddings=10, embedding_dim=16, pooling_factor=1.0),
        ),
    )
    with pytest.raises(ConfigError, match=r"one embedding dim.*\[8, 16\]"):
        DLRMModule(mixed)
    with pytest.raises(ConfigError, match="end with the embedding dim 16"):
        DLRMModule(synthetic.tiny_spec(), dense_arch_layer_sizes=[32, 8])
    with pytest.raises(ConfigError, match="unknown DLRMConfig fields"):
        DLRMModule(synthetic.tiny_spec(), learning_rate=0.1)


def test_tables_start_on_meta_and_materialize(synthetic) -> None:
    spec = synthetic.tiny_spec()
    module = DLRMModule(spec, interaction="dcn", **SMALL)
    assert isinstance(module.model, DLRM_DCN)
    assert module.embeddings_on_meta() and list(module.embedding_modules()) == [EMBEDDING_PATH]
    batch = synthetic.synthetic_batches(spec, num_batches=1, batch_size=8)[0]
    with pytest.raises(EmbarkError, match="materialize_embeddings"):
        module(batch.dense_features, batch.sparse_features)
    module.materialize_embeddings()
    assert not module.embeddings_on_meta()
    assert module(batch.dense_features, batch.sparse_features).shape == (8,)


def test_single_process_optimizers(synthetic) -> None:
    module = DLRMModule(synthetic.tiny_spec(), sparse_lr=0.3, eps=1e-6, **SMALL)
    module.materialize_embeddings()
    optimizer = module.configure_optimizers()
    assert isinstance(optimizer, ChainedOptimizer)
    dense, sparse = optimizer.optimizers
    assert type(dense) is torch.optim.Adagrad and type(sparse) is RowWiseAdagrad
    embedding = set(module.embedding_modules()[EMBEDDING_PATH].parameters())
    assert set(sparse.param_groups[0]["params"]) == embedding
    assert not embedding & set(dense.param_groups[0]["params"])
    assert sparse.param_groups[0]["lr"] == 0.3 and sparse.param_groups[0]["eps"] == 1e-6
    adam = DLRMModule(
        synthetic.tiny_spec(), dense_optimizer="adam", sparse_optimizer="sgd", **SMALL
    )
    adam.materialize_embeddings()
    kinds = [type(o) for o in adam.configure_optimizers().optimizers]
    assert kinds == [torch.optim.Adam, torch.optim.SGD]


def test_in_backward_embeddings_leave_only_the_dense_optimizer(synthetic) -> None:
    """What the torchrec strategy relies on: weights with a fused optimizer are skipped."""
    module = DLRMModule(synthetic.tiny_spec(), **SMALL)
    module.materialize_embeddings()
    spec = module.sparse_optimizer_spec()
    ebc = module.embedding_modules()[EMBEDDING_PATH]
    _apply_optimizer_in_backward(spec.optimizer_class, ebc.parameters(), spec.optimizer_kwargs)
    optimizer = module.configure_optimizers()
    assert type(optimizer) is torch.optim.Adagrad
    assert not set(ebc.parameters()) & set(optimizer.param_groups[0]["params"])


def test_chained_optimizer_evaluates_closure_once() -> None:
    a, b = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(2, 3))
    chained = ChainedOptimizer([torch.optim.SGD([a], lr=0.5), RowWiseAdagrad([b], lr=0.5)])
    calls = []

    def closure() -> torch.Tensor:
        calls.append(1)
        chained.zero_grad()
        loss = a.sum() + b.sum()
        loss.backward()
        return loss

    assert chained.step(closure).item() == 8.0 and calls == [1]
    assert torch.allclose(a, torch.full((2,), 0.5)) and (b < 1).all()
    state = chained.state_dict()
    chained.load_state_dict(state)
    assert len(chained.param_groups) == 2
    with pytest.raises(ConfigError, match="expected 2"):
        chained.load_state_dict({"optimizers": [state["optimizers"][0]]})


class _Losses(Callback):
    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.losses.append(float(outputs["loss"]))


@pytest.mark.parametrize("interaction", ["dot", "dcn"])
def test_plain_lightning_training_lowers_the_loss(synthetic, interaction: str) -> None:
    spec = synthetic.tiny_spec()
    train = synthetic.synthetic_batches(spec, num_batches=8, batch_size=64, seed=0)
    val = synthetic.synthetic_batches(spec, num_batches=2, batch_size=64, seed=1)
    torch.manual_seed(0)
    module = DLRMModule(spec, interaction=interaction, dense_lr=0.05, sparse_lr=0.05, **SMALL)
    record = _Losses()
    trainer = quiet_trainer(max_epochs=3, callbacks=[record])
    trainer.fit(
        module,
        DataLoader(synthetic.BatchDataset(train), batch_size=None),
        DataLoader(synthetic.BatchDataset(val), batch_size=None),
    )
    first, last = sum(record.losses[:8]) / 8, sum(record.losses[-8:]) / 8
    assert len(record.losses) == 24 and last < 0.6 * first, record.losses
    metrics = trainer.callback_metrics
    assert {"train_loss", "val_loss", "val_auc"} <= set(metrics)
    assert metrics["val_auc"] > 0.6  # the validation split shares the hidden labelling model


def test_all_categorical_data_trains_on_embeddings_alone(synthetic) -> None:
    """No dense features: the bottom MLP reads a constant 1 (one learned vector), the
    batches' empty dense tensor is accepted, and the labels (a function of the IDs only
    here) are learned."""
    spec = synthetic.tiny_spec(num_dense=0)
    train = synthetic.synthetic_batches(spec, num_batches=8, batch_size=64, seed=0)
    assert train[0].dense_features.shape == (64, 0)
    torch.manual_seed(0)
    module = DLRMModule(spec, interaction="dot", dense_lr=0.05, sparse_lr=0.05, **SMALL)
    assert module.model.dense_arch.model._mlp[0]._linear.in_features == 1
    record = _Losses()
    quiet_trainer(max_epochs=3, callbacks=[record]).fit(
        module, DataLoader(synthetic.BatchDataset(train), batch_size=None)
    )
    first, last = sum(record.losses[:8]) / 8, sum(record.losses[-8:]) / 8
    assert last < 0.8 * first, record.losses
    logits = module(train[0].dense_features, train[0].sparse_features)
    assert logits.shape == (64,) and torch.isfinite(logits).all()


class _Recorder(Logger):
    """The ``train_loss`` values Lightning hands its loggers, step by step."""

    def __init__(self) -> None:
        super().__init__()
        self.train_loss: list[float] = []

    @property
    def name(self) -> str:
        return "recorder"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        if "train_loss" in metrics:
            self.train_loss.append(float(metrics["train_loss"]))


def _fit_logging(
    synthetic: Any, batch_size: int, world: int, seed: int
) -> tuple[_Losses, _Recorder]:
    spec = synthetic.tiny_spec()
    batches = synthetic.synthetic_batches(spec, num_batches=2, batch_size=batch_size, seed=seed)
    torch.manual_seed(0)
    module = DLRMModule(spec, **SMALL)
    local, logged = _Losses(), _Recorder()
    trainer = quiet_trainer(
        strategy="ddp" if world > 1 else "auto",
        devices=world,
        max_steps=2,
        logger=logged,
        log_every_n_steps=1,
        use_distributed_sampler=False,
        callbacks=[local],
    )
    trainer.fit(module, DataLoader(synthetic.BatchDataset(batches), batch_size=None))
    return local, logged


#: Per-rank batch sizes: unequal, as in a global batch whose last slice is short.
_SIZES = (16, 8)


def _check_global_train_loss(rank: int, world: int, synthetic: Any) -> None:
    local, logged = _fit_logging(synthetic, _SIZES[rank], world, seed=rank)
    losses = [None] * world
    dist.all_gather_object(losses, local.losses)
    expected = [
        sum(n * ranks[step] for n, ranks in zip(_SIZES, losses, strict=True)) / sum(_SIZES)
        for step in range(2)
    ]
    # fp32: n * loss is exact (n a power of 2), then one addition and one division.
    assert logged.train_loss == pytest.approx(expected, rel=2 * U, abs=0), (rank, losses)


@pytest.mark.multiprocess
def test_train_loss_is_the_mean_over_the_global_batch(synthetic) -> None:
    """Each rank's loss is the mean over its own ``n_r`` samples, so the global batch's
    mean is ``sum_r n_r loss_r / sum_r n_r``; every rank logs that (not rank 0's own loss,
    nor the unweighted mean of the ranks' means, which a short slice would skew), with
    two fp32 roundings (``2u`` relative). One process logs its own loss: ``(24 loss) / 24``
    rounds twice as well."""
    run_gloo_ranks(_check_global_train_loss, 2, synthetic)
    local, logged = _fit_logging(synthetic, sum(_SIZES), 1, seed=0)
    assert logged.train_loss == pytest.approx(local.losses, rel=2 * U, abs=0)
