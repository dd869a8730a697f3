"""Sharded checkpoints of ``strategy="embark"``: save, reshard, resume, export, mismatch.

One 4-rank run (2 hosts x 2) trains a few steps under a plan mixing RB (hash grid and
column split), UB (hash rows) and DP, saves a checkpoint and records reference outputs;
the other tests load that checkpoint on 2 ranks, under another plan on 4 ranks, and
into an unsharded ``EmbeddingBagCollection``. A second run saves with (identity) towers
on 2 x 2; it loads on 4 x 1 with the same towers and on 2 x 2 without towers.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from lightning_embark.errors import ConfigError
from lightning_embark.models import EMBEDDING_PATH, DLRMModule
from lightning_embark.plan import layouts
from lightning_embark.plan._types import ClusterPlan, ClusterType, Plan, RowSplit
from lightning_embark.registry import register_strategies
from lightning_embark.sharding import export_tables, read_tables
from lightning_embark.strategies import EmbarkStrategy
from lightning_embark.testing import quiet_trainer
from lightning_embark.testing._ranks import run_gloo_ranks
from lightning_embark.testing._tower_scenarios import four_table_towers_plan

BATCH = 8


class _Losses(Callback):
    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.losses.append(float(outputs["loss"]))


class _Outputs(Callback):
    """Logits and pooled embeddings on a fixed batch, right after the checkpoint was restored."""

    def __init__(self, batch: Any) -> None:
        self.batch = batch
        self.outputs: dict[str, torch.Tensor] = {}

    def on_train_start(self, trainer: Trainer, pl_module: Any) -> None:
        self.outputs = _outputs(pl_module, self.batch)


def _outputs(model: DLRMModule, batch: Any) -> dict[str, torch.Tensor]:
    with torch.no_grad():
        pooled = model.embedding_modules()[EMBEDDING_PATH](batch.sparse_features).values()
        return {"logits": model(batch.dense_features, batch.sparse_features), "pooled": pooled}


def _spec(synthetic: Any) -> Any:
    return synthetic.tiny_spec(rows=90, dim=8)


def _model(spec: Any) -> DLRMModule:
    torch.manual_seed(0)
    return DLRMModule(
        spec,
        dense_arch_layer_sizes=[8],
        over_arch_layer_sizes=[8, 1],
        dense_lr=0.05,
        sparse_lr=0.1,
        sparse_optimizer="rowwise_adagrad",
    )


def _trainer(
    world: int, steps: int, callbacks: list[Callback], plan: Plan, **kwargs: Any
) -> Trainer:
    return quiet_trainer(
        strategy=EmbarkStrategy(plan=plan),
        devices=world,
        max_steps=steps,
        use_distributed_sampler=False,
        callbacks=callbacks,
        **kwargs,
    )


def _plan(world: int, variant: str) -> Plan:
    """``mixed``: RB hash grid + column split, UB hash rows, DP; ``other``: ranges, table-wise,
    replicas; ``towers`` / ``towers-4x1``: identity towers on the first and last host (2
    ranks per host, or 1) beside a flat DP table."""
    if variant.startswith("towers"):
        return four_table_towers_plan(world, 1 if variant == "towers-4x1" else 2)
    rph = 2
    hierarchical = world > rph
    clusters = (
        ClusterPlan(name="dp", type=ClusterType.DP),
        ClusterPlan(name="rb", type=ClusterType.RB, hierarchical=hierarchical),
        ClusterPlan(name="ub", type=ClusterType.UB, hierarchical=hierarchical),
    )
    ranks = list(range(world))
    if variant == "mixed":
        tables = (
            layouts.grid("f0", "rb", [ranks[: world // 2], ranks[world // 2 :]]),
            layouts.column_wise("f1", "rb", ranks[:2]),
            layouts.row_wise("f2", "ub", ranks),
            layouts.data_parallel("f3", "dp", world),
        )
    else:
        tables = (
            layouts.row_wise("f0", "ub", ranks[::-1], split=RowSplit.RANGE),
            layouts.replicated(
                "f1", "rb", [ranks[: world // 2], ranks[world // 2 :]], num_row_shards=world // 2
            ),
            layouts.table_wise("f2", "rb", world - 1),
            layouts.row_wise("f3", "ub", ranks[1:] + ranks[:1]),
        )
    return Plan(world_size=world, ranks_per_host=rph, clusters=clusters, tables=tables)


def _batches(synthetic: Any, spec: Any, rank: int, num: int) -> DataLoader:
    batches = synthetic.synthetic_batches(spec, num_batches=num, batch_size=BATCH, seed=10 + rank)
    return DataLoader(synthetic.BatchDataset(batches), batch_size=None)


def _eval_batch(synthetic: Any, spec: Any) -> Any:
    return synthetic.synthetic_batches(spec, num_batches=1, batch_size=24, seed=99)[0]


def _gathered_tables(model: DLRMModule, world: int) -> dict[str, torch.Tensor]:
    """Full tables assembled from every rank's blocks."""
    shards = [
        (s.table, s.rows, s.col_start, s.col_end, s.weight.clone())
        for s in model.embedding_modules()[EMBEDDING_PATH].local_shards()
    ]
    everything: list = [None] * world
    dist.all_gather_object(everything, shards)
    tables: dict[str, torch.Tensor] = {}
    for config in model.spec.embedding_bag_configs():
        tables[config.name] = torch.full(
            (config.num_embeddings, config.embedding_dim), float("nan")
        )
    for per_rank in everything:
        for table, rows, c0, c1, weight in per_rank:
            tables[f"t_{table}"][rows, c0:c1] = weight
    assert not any(t.isnan().any() for t in tables.values())
    return tables


def _save(rank: int, world: int, synthetic: Any, out: Path, variant: str = "mixed") -> None:
    register_strategies()
    spec = _spec(synthetic)
    model = _model(spec)
    trainer = _trainer(world, 3, [], _plan(world, variant))
    trainer.fit(model, _batches(synthetic, spec, rank, 3))
    trainer.save_checkpoint(out / "ckpt")
    reference = _outputs(model, _eval_batch(synthetic, spec))
    if variant == "mixed":
        reference["tables"] = _gathered_tables(model, world)
    if rank == 0:
        torch.save(reference, out / "reference.pt")


@pytest.fixture(scope="module")
def saved(synthetic: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("embark_ckpt")
    run_gloo_ranks(_save, 4, synthetic, out)
    return out


def _load(rank: int, world: int, synthetic: Any, out: Path, variant: str) -> None:
    register_strategies()
    spec = _spec(synthetic)
    reference = torch.load(out / "reference.pt")
    model = _model(spec)
    outputs, losses = _Outputs(_eval_batch(synthetic, spec)), _Losses()
    trainer = _trainer(world, 5, [outputs, losses], _plan(world, variant))
    trainer.fit(model, _batches(synthetic, spec, rank, 2), ckpt_path=out / "ckpt")
    # Restored state, under this plan and world size: same tables, optimizer state, outputs.
    saved_state = read_tables(out / "ckpt", optimizer_state=True)[EMBEDDING_PATH]
    torch.testing.assert_close(
        outputs.outputs["pooled"], reference["pooled"], rtol=1e-5, atol=1e-6
    )
    torch.testing.assert_close(
        outputs.outputs["logits"], reference["logits"], rtol=1e-5, atol=1e-6
    )
    # Training continued from step 3 and the state moved on from the checkpoint.
    assert trainer.global_step == 5 and len(losses.losses) == 2
    assert all(math.isfinite(x) for x in losses.losses)
    for shard in model.embedding_modules()[EMBEDDING_PATH].local_shards():
        saved_state_rows = saved_state[f"t_{shard.table}/optimizer_state"][shard.rows]
        assert (
            shard.optimizer_state is not None
            and shard.optimizer_state.shape == saved_state_rows.shape
        )
        assert (shard.optimizer_state >= saved_state_rows).all()


@pytest.mark.multiprocess
@pytest.mark.parametrize(("world", "variant"), [(2, "mixed"), (4, "other")])
def test_checkpoint_loads_under_another_world_size_or_plan(
    saved: Path, synthetic: Any, world: int, variant: str
) -> None:
    assert (saved / "ckpt").is_dir() and (saved / "ckpt" / "meta.pt").is_file()
    run_gloo_ranks(_load, world, synthetic, saved, variant)


@pytest.mark.multiprocess
@pytest.mark.parametrize("variant", ["towers-4x1", "mixed"])
def test_a_checkpoint_with_towers_loads_on_other_hosts_or_without_towers(
    synthetic: Any, tmp_path: Path, variant: str
) -> None:
    """Saved with identity towers on 2 x 2: the same towers on 4 x 1 and a flat plan on
    2 x 2 restore the same outputs and optimizer state (the tables' checkpoint layout
    does not depend on the plan, towers included)."""
    run_gloo_ranks(_save, 4, synthetic, tmp_path, "towers")
    run_gloo_ranks(_load, 4, synthetic, tmp_path, variant)


def _load_exact(rank: int, world: int, synthetic: Any, out: Path) -> None:
    """Blocks and optimizer state equal the saved full tables exactly, right after loading."""
    register_strategies()
    spec = _spec(synthetic)
    model = _model(spec)
    trainer = _trainer(world, 1, [], _plan(world, "other"))
    trainer.validate(
        model, _batches(synthetic, spec, rank, 1), ckpt_path=out / "ckpt", verbose=False
    )
    saved_state = read_tables(out / "ckpt", optimizer_state=True)[EMBEDDING_PATH]
    for shard in model.embedding_modules()[EMBEDDING_PATH].local_shards():
        full = saved_state[f"t_{shard.table}"]
        torch.testing.assert_close(
            shard.weight, full[shard.rows, shard.col_start : shard.col_end], rtol=0, atol=0
        )
        torch.testing.assert_close(
            shard.optimizer_state,
            saved_state[f"t_{shard.table}/optimizer_state"][shard.rows],
            rtol=0,
            atol=0,
        )


@pytest.mark.multiprocess
def test_resharded_blocks_and_state_equal_the_saved_tables(saved: Path, synthetic: Any) -> None:
    run_gloo_ranks(_load_exact, 2, synthetic, saved)


def test_export_equals_gathered_tables_and_pools_like_the_sharded_model(
    saved: Path, synthetic: Any, tmp_path: Path
) -> None:
    reference = torch.load(saved / "reference.pt")
    exported = export_tables(saved / "ckpt", tmp_path / "tables.pt")
    assert sorted(exported) == [f"embedding_bags.t_f{i}.weight" for i in range(4)]
    for name, table in reference["tables"].items():
        torch.testing.assert_close(
            exported[f"embedding_bags.{name}.weight"], table, rtol=0, atol=0
        )
    spec = _spec(synthetic)
    ebc = EmbeddingBagCollection(tables=spec.embedding_bag_configs())
    ebc.load_state_dict(torch.load(tmp_path / "tables.pt"))
    pooled = ebc(_eval_batch(synthetic, spec).sparse_features).values().detach()
    torch.testing.assert_close(pooled, reference["pooled"], rtol=1e-5, atol=1e-6)
    with pytest.raises(ConfigError, match="not a checkpoint written by strategy='embark'"):
        export_tables(tmp_path)


def _resume(rank: int, world: int, synthetic: Any, out: Path) -> None:
    register_strategies()
    spec = _spec(synthetic)
    plan = _plan(world, "mixed")
    straight = _Losses()
    checkpoints = ModelCheckpoint(dirpath=out, save_top_k=-1, every_n_epochs=1)
    trainer = _trainer(world, 4, [straight, checkpoints], plan, enable_checkpointing=True)
    # One batch per epoch: resuming from a checkpoint saved at an epoch's end, Lightning
    # (any strategy) re-enters that epoch with a fresh iterator of a plain DataLoader, so
    # only a loader whose every epoch is the same keeps both runs on the same data.
    trainer.fit(_model(spec), _batches(synthetic, spec, rank, 1))
    path = out / "epoch=1-step=2.ckpt"
    assert path.is_dir() and (path / "meta.pt").is_file(), sorted(p.name for p in out.iterdir())
    resumed = _Losses()
    _trainer(world, 4, [resumed], plan).fit(
        _model(spec), _batches(synthetic, spec, rank, 1), ckpt_path=path
    )
    assert len(straight.losses) == 4 and len(resumed.losses) == 2
    assert resumed.losses == straight.losses[2:], (straight.losses, resumed.losses)


@pytest.mark.multiprocess
def test_resume_with_model_checkpoint_continues_like_an_uninterrupted_run(
    synthetic: Any, tmp_path: Path
) -> None:
    run_gloo_ranks(_resume, 2, synthetic, tmp_path)


def test_checkpoint_of_another_model_is_refused_by_name(
    single_rank_world, synthetic: Any, tmp_path: Path
) -> None:
    spec = _spec(synthetic)
    plan = Plan(
        world_size=1,
        ranks_per_host=1,
        clusters=(ClusterPlan(name="rb", type=ClusterType.RB),),
        tables=tuple(layouts.table_wise(f"f{i}", "rb", 0) for i in range(4)),
    )
    trainer = _trainer(1, 1, [], plan)
    trainer.fit(_model(spec), _batches(synthetic, spec, 0, 1))
    trainer.save_checkpoint(tmp_path / "ckpt")
    other = synthetic.tiny_spec(rows=70, dim=8)
    with pytest.raises(
        ConfigError,
        match=r"saved from another model: table '.*/t_f0' is \(90, 8\) in the "
        r"checkpoint but \(70, 8\) in the model",
    ):
        _trainer(1, 2, [], plan).fit(
            _model(other), _batches(synthetic, other, 0, 1), ckpt_path=tmp_path / "ckpt"
        )
    with pytest.raises(ConfigError, match="is not a checkpoint written by strategy='embark'"):
        _trainer(1, 2, [], plan).fit(
            _model(spec), _batches(synthetic, spec, 0, 1), ckpt_path=tmp_path
        )
