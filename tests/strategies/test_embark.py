"""``strategy="embark"``: registration, options, planning helpers and every refusal, on one
rank."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.strategies import StrategyRegistry
from torch import nn
from torch.utils.data import DataLoader
from torchrec.datasets.utils import Batch
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from lightning_embark.accounting import CommAccountingCallback
from lightning_embark.engine._optimizer import OptimizerKind, SparseOptimizer
from lightning_embark.errors import ConfigError
from lightning_embark.models import DLRMModule, SparseOptimizerSpec
from lightning_embark.plan import TowerRequest, layouts, plan_summary, save_towers
from lightning_embark.plan._types import ClusterPlan, ClusterType, Compression, Plan
from lightning_embark.registry import register_strategies
from lightning_embark.sharding import (
    EmbarkMetricsCallback,
    EmbarkModelSummary,
    automatic_plan,
    check_allow,
    engine_optimizer,
    find_embedding_collections,
    find_sparse_features,
    sample_stats,
    spec_of,
    table_configs,
    torchrec_planner_plan,
    validate_plan,
)
from lightning_embark.strategies import EmbarkStrategy
from lightning_embark.testing import quiet_trainer, run_gloo_ranks
from lightning_embark.topology import topology_preset


def _configs(rows: int = 1500, dim: int = 8) -> list[EmbeddingBagConfig]:
    return [
        EmbeddingBagConfig(
            name=f"t_f{i}", num_embeddings=rows, embedding_dim=dim, feature_names=[f"f{i}"]
        )
        for i in range(3)
    ]


def _rb_plan(tables: list[str], world: int = 1) -> Plan:
    return Plan(
        world_size=world,
        ranks_per_host=world,
        clusters=(ClusterPlan(name="rb", type=ClusterType.RB),),
        tables=tuple(layouts.table_wise(t, "rb", 0) for t in tables),
    )


def test_registered_and_options_validated() -> None:
    register_strategies()
    strategy = StrategyRegistry.get("embark")
    assert isinstance(strategy, EmbarkStrategy) and strategy.options.allow == (Compression.FP32,)
    assert "no plan yet" in strategy.plan_summary()
    assert EmbarkStrategy(allow="fp16,int8").options.allow == (Compression.FP16, Compression.INT8)
    with pytest.raises(ConfigError, match="'fp64'"):
        EmbarkStrategy(allow=["fp64"])
    with pytest.raises(ConfigError, match="store='cuda'"):
        EmbarkStrategy(store="cuda")
    with pytest.raises(ConfigError, match="embedding_grad='avg'"):
        EmbarkStrategy(embedding_grad="avg")
    with pytest.raises(ConfigError, match="topology"):
        EmbarkStrategy(topology=3)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="unique_ratios"):
        EmbarkStrategy(unique_ratios={"f0": 1.5})
    with pytest.raises(ConfigError, match="sparse_optimizer"):
        EmbarkStrategy(sparse_optimizer="sgd")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="cannot read plan"):
        EmbarkStrategy(plan="/nonexistent/plan.json")
    with pytest.raises(ConfigError, match="planner='optuna' is unknown"):
        EmbarkStrategy(planner="optuna")
    with pytest.raises(ConfigError, match="planner='torchrec' plans fp32 exchanges only"):
        EmbarkStrategy(planner="torchrec", allow="fp16")
    assert StrategyRegistry.get("embark-torchrec-plan").options.planner == "torchrec"
    assert StrategyRegistry.get("embark-towers").options.towers == "auto"


def test_torchrec_planner_plan_is_torchrecs_layout_on_the_engine() -> None:
    spec = _tiny_spec()
    topology = topology_preset("emulated", num_hosts=1, ranks_per_host=2)
    plan = torchrec_planner_plan(spec, topology, batch_size=64)
    plan.validate(spec, topology)
    assert plan.world_size == 2 and {t.table for t in plan.tables} == {t.name for t in spec.tables}
    assert {c.type for c in plan.clusters} <= {ClusterType.RB, ClusterType.DP}
    assert all(
        c.forward_compression == Compression.FP32 and c.backward_compression == Compression.FP32
        for c in plan.clusters
    )


def test_plan_file_is_read_at_construction(tmp_path: Path) -> None:
    plan = _rb_plan(["f0", "f1", "f2"])
    plan.save(tmp_path / "plan.json")
    strategy = EmbarkStrategy(plan=tmp_path / "plan.json")
    assert strategy.plan == plan
    summary = strategy.plan_summary()
    assert "cluster rb (RB, compression fwd/bwd fp32/fp32, flat): 3 table(s)" in summary
    assert "f1: RB r=1 k=1 c=1 compression=fp32/fp32 ranks=0" in summary


def test_tower_options_are_read_and_checked_at_construction(tmp_path: Path) -> None:
    path = tmp_path / "towers.json"
    save_towers([TowerRequest(name="a", tables=("f0", "f1"), host=0)], path)
    assert EmbarkStrategy(towers=path).options.towers == (
        TowerRequest(name="a", tables=("f0", "f1"), host=0),
    )
    assert EmbarkStrategy(towers="auto").options.towers == "auto"
    assert EmbarkStrategy(towers=2).options.towers == 2
    with pytest.raises(ConfigError, match="both a plan and towers"):
        EmbarkStrategy(plan=_rb_plan(["f0"]), towers=2)
    with pytest.raises(ConfigError, match="towers must be a positive count"):
        EmbarkStrategy(towers=0)
    with pytest.raises(ConfigError, match="need planner='greedy'"):
        EmbarkStrategy(towers=2, planner="torchrec")
    with pytest.raises(ConfigError, match=r"towers \['p'\] have compressing tower modules"):
        EmbarkStrategy(
            towers=[TowerRequest(name="p", tables=("f0",), module="projection", output_dim=2)]
        )
    with pytest.raises(ConfigError, match="cannot read towers file"):
        EmbarkStrategy(towers=str(tmp_path / "nope.json"))


def test_trainer_options_and_optimizer_translation() -> None:
    EmbarkStrategy.check_trainer_options(
        precision="32-true", gradient_clip_val=None, accumulate_grad_batches=1
    )
    EmbarkStrategy.check_trainer_options(
        precision="bf16-mixed", gradient_clip_val=0, accumulate_grad_batches=1
    )
    with pytest.raises(ConfigError, match=r"gradient_clip_val=1\.0"):
        EmbarkStrategy.check_trainer_options(
            precision="32-true", gradient_clip_val=1.0, accumulate_grad_batches=1
        )
    with pytest.raises(ConfigError, match="accumulate_grad_batches=2"):
        EmbarkStrategy.check_trainer_options(
            precision="32-true", gradient_clip_val=None, accumulate_grad_batches=2
        )
    with pytest.raises(ConfigError, match="16-mixed"):
        EmbarkStrategy.check_trainer_options(
            precision="16-mixed", gradient_clip_val=None, accumulate_grad_batches=1
        )
    sgd = engine_optimizer(SparseOptimizerSpec(kind="sgd", lr=0.3, eps=0.0))
    assert (sgd.kind, sgd.lr) == (OptimizerKind.SGD, 0.3) and sgd.eps > 0
    given = SparseOptimizer(kind=OptimizerKind.ADAGRAD, lr=0.1)
    assert engine_optimizer(given) is given


def test_collections_found_declared_or_scanned() -> None:
    assert list(find_embedding_collections(DLRMModule(_tiny_spec()))) == [
        "model.sparse_arch.embedding_bag_collection"
    ]

    class Scanned(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tower = nn.ModuleDict(
                {"emb": EmbeddingBagCollection(tables=_configs(), device=torch.device("meta"))}
            )

    found = find_embedding_collections(Scanned())
    assert list(found) == ["tower.emb"] and len(table_configs(found)) == 3
    with pytest.raises(ConfigError, match="no torchrec EmbeddingBagCollection"):
        find_embedding_collections(nn.Linear(2, 2))
    twice = {
        "a": EmbeddingBagCollection(tables=_configs()),
        "b": EmbeddingBagCollection(tables=_configs()),
    }
    with pytest.raises(ConfigError, match="more than one embedding collection"):
        table_configs(twice)


def test_sample_statistics_drive_the_automatic_plan() -> None:
    configs = _configs(
        rows=2_000_000, dim=128
    )  # too big to replicate: the exchange type is what is chosen
    # f0: 64 samples x 2 IDs from 4 distinct values (ratio 1/32); f1, f2: all distinct.
    f0 = torch.arange(128) % 4
    others = torch.arange(128)
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=["f0", "f1", "f2"],
        values=torch.cat([f0, others, others]),
        lengths=torch.full((192,), 2),
    )
    batch = Batch(dense_features=torch.zeros(64, 1), sparse_features=kjt, labels=torch.zeros(64))
    assert find_sparse_features(batch) is kjt and find_sparse_features({"x": 1, "s": kjt}) is kjt
    stats = sample_stats(configs, kjt)
    assert stats["f0"].unique_ratio == pytest.approx(4 / 128) and stats["f1"].unique_ratio == 1.0
    assert stats["f0"].pooling_factor == 2.0
    spec = spec_of(configs, stats=stats)
    assert [t.name for t in spec.tables] == ["f0", "f1", "f2"] and spec.tables[
        0
    ].pooling_factor == 2.0
    # two hosts: the pooled rows f0 would send cross the slow link, which repays a second cluster
    topology = topology_preset("emulated", num_hosts=2, ranks_per_host=1)
    plan = automatic_plan(
        spec,
        topology,
        unique_ratios={n: s.unique_ratio for n, s in stats.items()},
        allow=check_allow(["fp16"]),
        batch_size=4096,
    )
    # The greedy planner: the measured low unique ratio makes f0 unique-based; the others
    # are not (small enough to replicate, or reduction-based); only allowed compressions.
    kinds = {t.table: plan.cluster(t.cluster).type for t in plan.tables}
    assert kinds["f0"] is ClusterType.UB and ClusterType.UB not in (kinds["f1"], kinds["f2"])
    assert {c.forward_compression for c in plan.clusters} <= {Compression.FP32, Compression.FP16}
    assert "f0: UB r=1" in plan_summary(plan, topology)
    all_distinct = automatic_plan(
        spec,
        topology,
        unique_ratios=dict.fromkeys(stats, 1.0),
        allow=check_allow(["fp16"]),
        batch_size=4096,
    )
    assert all_distinct.cluster(all_distinct.layout("f0").cluster).type is not ClusterType.UB


def test_plan_checked_against_tables_and_world() -> None:
    configs = _configs()
    validate_plan(_rb_plan(["f0", "f1", "f2"]), configs, world_size=1)
    validate_plan(
        _rb_plan(["t_f0", "t_f1", "f2"]), configs, world_size=1
    )  # torchrec names work too
    with pytest.raises(ConfigError, match=r"plan is for 2 ranks .* this job runs 1"):
        validate_plan(_rb_plan(["f0", "f1", "f2"], world=2), configs, world_size=1)
    with pytest.raises(ConfigError, match=r"'t_f2' .* missing from the plan"):
        validate_plan(_rb_plan(["f0", "f1"]), configs, world_size=1)
    with pytest.raises(ConfigError, match=r"tables \['g9'\] that the module does not have"):
        validate_plan(_rb_plan(["f0", "f1", "f2", "g9"]), configs, world_size=1)
    cw = Plan(
        world_size=1,
        ranks_per_host=1,
        clusters=(ClusterPlan(name="rb", type=ClusterType.RB),),
        tables=(layouts.column_wise("f0", "rb", [0, 0, 0]), *_rb_plan(["f1", "f2"]).tables),
    )
    with pytest.raises(ConfigError, match="3 column shards do not divide embedding_dim 8"):
        validate_plan(cw, configs, world_size=1)


# --- through a Trainer, on one rank --------------------------------------------------


def _tiny_spec():
    from lightning_embark.spec import ModelSpec, TableSpec

    tables = tuple(
        TableSpec(name=f"f{i}", num_embeddings=1500, embedding_dim=8, pooling_factor=2.0)
        for i in range(3)
    )
    return ModelSpec(name="tiny3", tables=tables, num_dense_features=4)


def _batches(num: int, *, duplicated: bool = False) -> list[Batch]:
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(num):
        ids = [
            torch.randint(0, 4 if duplicated and i == 0 else 1500, (64,), generator=g)
            for i in range(3)
        ]
        kjt = KeyedJaggedTensor.from_lengths_sync(
            keys=["f0", "f1", "f2"], values=torch.cat(ids), lengths=torch.full((96,), 2)
        )
        dense = torch.randn(32, 4, generator=g)
        out.append(
            Batch(dense_features=dense, sparse_features=kjt, labels=(dense[:, 0] > 0).float())
        )
    return out


def _loader(batches: list[Batch]) -> DataLoader:
    return DataLoader(batches, batch_size=None)


def _trainer(strategy: object = "embark", **kwargs: object) -> Trainer:
    return quiet_trainer(**({"strategy": strategy, "max_steps": 2} | kwargs))


def _dlrm() -> DLRMModule:
    return DLRMModule(_tiny_spec(), dense_arch_layer_sizes=[8], over_arch_layer_sizes=[4, 1])


def test_single_rank_fit_measures_statistics_and_refuses(
    single_rank_world, tmp_path: Path
) -> None:
    model = _dlrm()
    metrics = EmbarkMetricsCallback()
    trainer = _trainer(callbacks=[metrics])
    trainer.fit(model, _loader(_batches(2, duplicated=True)))
    assert trainer.global_step == 2
    assert len(metrics.steps) == 2
    for step in metrics.steps:
        assert step["embark/embedding_forward_ms"] > 0 and step["embark/embedding_backward_ms"] > 0
        assert (
            step["embark/step_ms"] >= step["embark/embedding_forward_ms"] + step["embark/dense_ms"]
        )
        assert (
            step["embark/unique_ratio/f0"] == pytest.approx(4 / 64)
            and step["embark/unique_ratio/f1"] > 0.9
        )
    assert "embark/embedding_backward_ms" in trainer.callback_metrics
    strategy = trainer.strategy
    assert isinstance(strategy, EmbarkStrategy)
    # One rank exchanges nothing, so one table-wise cluster is cheapest whatever the ratios
    # (test_sample_statistics_drive_the_automatic_plan shows them choosing UB).
    assert {t.table: (t.num_row_shards, t.num_col_shards) for t in strategy.plan.tables} == {
        "f0": (1, 1),
        "f1": (1, 1),
        "f2": (1, 1),
    }
    assert [n for n, _ in model.named_parameters() if "embedding" in n] == []
    assert {"val_loss", "val_auc"} <= set(
        trainer.validate(model, _loader(_batches(1)), verbose=False)[0]
    )
    trainer.save_checkpoint(tmp_path / "sharded.ckpt")  # a directory (see test_checkpoint.py)
    assert (tmp_path / "sharded.ckpt" / "meta.pt").is_file()
    # A fresh Trainer reuses the blocks of a module fitted before.
    assert _trainer().validate(model, _loader(_batches(1)), verbose=False)
    with pytest.raises(ConfigError, match="already sharded another LightningModule"):
        trainer.fit(_dlrm(), _loader(_batches(1)))
    with pytest.raises(ConfigError, match="use it with strategy='embark'"):
        _trainer("ddp", callbacks=[EmbarkMetricsCallback()]).fit(
            _NoEmbeddings(), _loader(_batches(1))
        )


def test_a_finished_run_keeps_no_thread_and_release_frees_the_groups(single_rank_world) -> None:
    """What a process that trains model after model (``embark-tune``'s ranks) relies on:
    after ``fit`` no dense all-reduce thread is left, and after ``release()`` the
    strategy's process groups are gone and the strategy refuses to run again."""
    import threading

    import torch.distributed as dist

    model = _dlrm()
    trainer = _trainer()
    trainer.fit(model, _loader(_batches(2)))
    assert "embark-dense-allreduce" not in {t.name for t in threading.enumerate()}
    strategy = trainer.strategy
    assert isinstance(strategy, EmbarkStrategy)
    sharded = strategy._sharded
    assert sharded is not None
    group = sharded.group
    assert dist.get_world_size(group) == 1
    strategy.release()
    strategy.release()  # twice is harmless
    with pytest.raises(ValueError, match="not registered"):
        dist.get_rank(group)  # destroyed
    with pytest.raises(ConfigError, match="was released"):
        trainer.fit(model, _loader(_batches(1)))


@pytest.mark.parametrize(
    ("trainer_kwargs", "match"),
    [
        (dict(accumulate_grad_batches=2), "accumulate_grad_batches=2"),
        (dict(gradient_clip_val=0.5), "gradient_clip_val=0.5"),
        (dict(precision="bf16-true"), "precision='bf16-true'"),
    ],
)
def test_trainer_options_refused_at_setup(
    single_rank_world, trainer_kwargs: dict, match: str
) -> None:
    with pytest.raises(ConfigError, match=match):
        _trainer(**trainer_kwargs).fit(_dlrm(), _loader(_batches(1)))


class _NoEmbeddings(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 1)

    def training_step(self, batch: Batch, batch_idx: int) -> torch.Tensor:
        return self.layer(batch.dense_features).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


@pytest.mark.parametrize(
    ("module", "plan", "match"),
    [
        (_NoEmbeddings, None, "_NoEmbeddings has no torchrec EmbeddingBagCollection"),
        (_dlrm, _rb_plan(["f0", "f1"]), "'t_f2' .* missing from the plan"),
        (
            _dlrm,
            _rb_plan(["f0", "f1", "f2", "other"]),
            r"\['other'\] that the module does not have",
        ),
        (_dlrm, _rb_plan(["f0", "f1", "f2"], world=2), "plan is for 2 ranks .* this job runs 1"),
    ],
)
def test_module_and_plan_errors_at_setup(single_rank_world, module, plan, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        _trainer(EmbarkStrategy(plan=plan)).fit(module(), _loader(_batches(1)))


def test_a_checkpoint_loads_only_into_tower_modules_of_its_shape(
    single_rank_world, tmp_path: Path
) -> None:
    """Tower modules are dense parameters of the model: a checkpoint written with
    ``projection`` towers at ratio 1 does not load into the same towers at ratio 2, and
    the error names the tower and the fix before anything is loaded."""
    from lightning_embark.plan import TowerModule

    def towered(ratio: float) -> DLRMModule:
        path = tmp_path / f"towers-{ratio}.json"
        request = TowerRequest(
            name="t", tables=("f0", "f1"), module=TowerModule.PROJECTION, output_ratio=ratio
        )
        save_towers([request], path)
        return DLRMModule(
            _tiny_spec(),
            dense_arch_layer_sizes=[8],
            over_arch_layer_sizes=[4, 1],
            towers=str(path),
        )

    trainer = _trainer()
    trainer.fit(towered(1.0), _loader(_batches(2)))
    trainer.save_checkpoint(tmp_path / "towers.ckpt")
    same = _trainer().validate(
        towered(1.0), _loader(_batches(1)), ckpt_path=tmp_path / "towers.ckpt", verbose=False
    )
    assert "val_loss" in same[0]
    with pytest.raises(ConfigError, match=r"tower modules of towers \[0\] have other shapes"):
        _trainer().validate(
            towered(2.0), _loader(_batches(1)), ckpt_path=tmp_path / "towers.ckpt", verbose=False
        )


# --- what a fit shows: the plan, the metrics, the summary ---------------------------


def test_fit_logs_default_metrics_to_tensorboard_and_counts_the_tables(
    single_rank_world, tmp_path: Path
) -> None:
    """``strategy="embark"`` adds the metrics callbacks (once: a second run of the trainer
    adds none), swaps Lightning's model summary for one that counts the sharded tables
    (3 tables x 1500 rows x 8 columns = 36,000 parameters beside the dense ones, which
    alone are what Lightning's summary sees after sharding), and a TensorBoardLogger gets
    every step's metrics."""
    from lightning.pytorch.loggers import TensorBoardLogger
    from lightning.pytorch.utilities.model_summary.model_summary import get_human_readable_count
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    model = _dlrm()
    tensorboard = TensorBoardLogger(tmp_path)
    trainer = _trainer(logger=tensorboard, log_every_n_steps=1, enable_model_summary=True)
    shown = _Records()
    summary_log = logging.getLogger("lightning.pytorch.callbacks.model_summary")
    summary_log.addHandler(shown)
    try:
        trainer.fit(model, _loader(_batches(2)))
    finally:
        summary_log.removeHandler(shown)
    _assert_one_of_each(trainer)
    (summary,) = [c for c in trainer.callbacks if isinstance(c, EmbarkModelSummary)]
    total = sum(p.numel() for p in model.parameters()) + 3 * 1500 * 8
    assert summary._summary(trainer, model).total_parameters == total
    (table,) = shown.messages
    assert f"{get_human_readable_count(total)}" in table and "Total params" in table
    events = EventAccumulator(tensorboard.log_dir)
    events.Reload()
    scalars = set(events.Tags()["scalars"])
    assert {
        "train_loss",
        "comm/intra_host_bytes",
        "comm/inter_host_bytes",
        "comm/embedding_exchange_ms",
        "embark/embedding_forward_ms",
        "embark/dense_ms",
        "embark/unique_ratio/f0",
    } <= scalars, scalars
    assert len(events.Scalars("train_loss")) == 2
    trainer.validate(model, _loader(_batches(1)), verbose=False)
    _assert_one_of_each(trainer)


def test_metrics_false_adds_no_callbacks(single_rank_world) -> None:
    trainer = _trainer(EmbarkStrategy(metrics=False))
    trainer.fit(_dlrm(), _loader(_batches(1)))
    assert not any(
        isinstance(c, (CommAccountingCallback, EmbarkMetricsCallback)) for c in trainer.callbacks
    )
    with pytest.raises(ConfigError, match="metrics must be True or False, got 'no'"):
        EmbarkStrategy(metrics="no")  # type: ignore[arg-type]


@pytest.mark.parametrize("passed", [{}, {"forward_sync_buffers": True}])
def test_the_dense_part_is_wrapped_as_torchrecs_unless_told(single_rank_world, passed) -> None:
    """DDP syncs no buffer at each forward (a collective across every rank per step, for a
    buffer as constant as the interaction's ``triu_indices``) and its gradients are views
    of its buckets, as under torchrec's ``DistributedModelParallel``; an argument the
    user passes wins."""
    wrapped: list[nn.Module] = []

    class _Wrapped(Callback):
        def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
            wrapped.append(trainer.strategy.model)

    trainer = _trainer(EmbarkStrategy(metrics=False, **passed), callbacks=[_Wrapped()])
    trainer.fit(_dlrm(), _loader(_batches(1)))
    (ddp,) = wrapped
    assert isinstance(ddp, torch.nn.parallel.DistributedDataParallel)
    assert ddp.forward_sync_buffers is passed.get("forward_sync_buffers", False)
    assert ddp.gradient_as_bucket_view is True


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _assert_one_of_each(trainer: Trainer) -> None:
    for kind in (CommAccountingCallback, EmbarkMetricsCallback):
        assert sum(isinstance(c, kind) for c in trainer.callbacks) == 1, trainer.callbacks


def _check_plan_printed_once_on_rank_zero(rank: int, world: int) -> None:
    shown = _Records()
    rank_zero = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    rank_zero.addHandler(shown)
    try:
        model = _dlrm()
        trainer = _trainer(devices=world, use_distributed_sampler=False)
        trainer.fit(model, _loader(_batches(2)))
        trainer.validate(model, _loader(_batches(1)), verbose=False)  # a second setup
    finally:
        rank_zero.removeHandler(shown)
    plans = [m for m in shown.messages if m.startswith("embark plan:")]
    assert len(plans) == (1 if rank == 0 else 0), (rank, shown.messages)
    if rank == 0:
        strategy = trainer.strategy
        assert isinstance(strategy, EmbarkStrategy)
        assert plans[0] == f"embark plan:\n{strategy.plan_summary()}"  # short: printed whole
    _assert_one_of_each(trainer)


@pytest.mark.multiprocess
def test_the_plan_is_printed_once_on_rank_zero() -> None:
    """Through Lightning's rank-zero channel (shown by default), at the setup that shards
    (not again when ``validate`` sets the strategy up a second time), and by no other
    rank."""
    run_gloo_ranks(_check_plan_printed_once_on_rank_zero, 2)
