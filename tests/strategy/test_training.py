"""``Trainer.fit`` with ``strategy="embark"`` on forked gloo ranks: it learns, and it is exact.

Exactness: N steps on W ranks, each fed its slice of the global batches, must equal
single-process training of the same DLRMModule (same initial weights) on the global
batches: per-step loss (mean over ranks), dense weights and every embedding block
after training. In fp32 this holds for SGD, Adagrad and row-wise Adagrad up to float
summation order (rtol 1e-5), because the strategy averages embedding gradients over
ranks as DDP does for dense ones.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from lightning.pytorch import Callback, Trainer
from torch.utils.data import DataLoader
from torchrec.datasets.utils import Batch

from lightning_embark.engine import layouts
from lightning_embark.engine.plan import ClusterPlan, ClusterType, Compression, Plan
from lightning_embark.engine.scenarios import concat_batches
from lightning_embark.engine.sharded import ShardedEmbeddingBagCollection
from lightning_embark.models import EMBEDDING_PATH, DLRMModule
from lightning_embark.registry import register_strategies
from lightning_embark.strategy import EmbarkStrategy
from lightning_embark.testing import run_gloo_ranks

BATCH = 16  # per rank (exactness)
STEPS = 40  # learning


class _Losses(Callback):
    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_train_batch_end(self, trainer: Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.losses.append(float(outputs["loss"]))


def _model(spec: Any, **overrides: Any) -> DLRMModule:
    torch.manual_seed(0)
    config = dict(dense_arch_layer_sizes=[16], over_arch_layer_sizes=[16, 1], dense_lr=0.05, sparse_lr=0.05)
    return DLRMModule(spec, **(config | overrides))


def _trainer(world: int, steps: int, callbacks: list[Callback], strategy: Any, **kwargs: Any) -> Trainer:
    return Trainer(
        strategy=strategy, accelerator="cpu", devices=world, max_steps=steps, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, use_distributed_sampler=False, callbacks=callbacks, **kwargs,
    )


def _mixed_plan(world: int, ranks_per_host: int) -> Plan:
    """RB table-wise and column-wise, UB row-wise (hash), DP: one table each."""
    hierarchical = world > ranks_per_host
    return Plan(
        world_size=world, ranks_per_host=ranks_per_host,
        clusters=(
            ClusterPlan(name="dp", type=ClusterType.DP),
            ClusterPlan(name="rb", type=ClusterType.RB, hierarchical=hierarchical),
            ClusterPlan(name="ub", type=ClusterType.UB, hierarchical=hierarchical),
        ),
        tables=(
            layouts.table_wise("f0", "rb", world - 1),
            layouts.column_wise("f1", "rb", range(world)),
            layouts.row_wise("f2", "ub", range(world)),
            layouts.data_parallel("f3", "dp", world),
        ),
    )


def _global(batches_per_rank: list[list[Batch]], step: int) -> Batch:
    parts = [batches[step] for batches in batches_per_rank]
    return Batch(
        dense_features=torch.cat([b.dense_features for b in parts]),
        sparse_features=concat_batches([b.sparse_features for b in parts]),
        labels=torch.cat([b.labels for b in parts]),
    )


def _single_process(model: DLRMModule, batches: list[Batch]) -> list[float]:
    """The oracle: plain single-process training of the module on the global batches."""
    model.materialize_embeddings()
    optimizer = model.configure_optimizers()
    losses = []
    for batch in batches:
        optimizer.zero_grad()
        logits = model(batch.dense_features, batch.sparse_features)
        loss = F.binary_cross_entropy_with_logits(logits, batch.labels.float())
        loss.backward()
        optimizer.step()
        losses.append(float(loss))
    return losses


def check_exact(rank: int, world: int, synthetic: Any, ranks_per_host: int, steps: int, sparse: str = "sgd") -> None:
    register_strategies()
    spec = synthetic.tiny_spec(rows=300)
    per_rank = [
        synthetic.synthetic_batches(spec, num_batches=steps, batch_size=BATCH, seed=10 + r) for r in range(world)
    ]
    model = _model(spec, sparse_optimizer=sparse, sparse_lr=0.5 if sparse == "sgd" else 0.05)
    model.materialize_embeddings()  # the same (seeded) tables for both runs
    reference = copy.deepcopy(model)
    expected = _single_process(reference, [_global(per_rank, s) for s in range(steps)])

    record = _Losses()
    strategy = EmbarkStrategy(plan=_mixed_plan(world, ranks_per_host))
    trainer = _trainer(world, steps, [record], strategy)
    trainer.fit(model, DataLoader(synthetic.BatchDataset(per_rank[rank]), batch_size=None))

    losses = torch.tensor(record.losses)
    gathered = [torch.zeros_like(losses) for _ in range(world)]
    dist.all_gather(gathered, losses)
    torch.testing.assert_close(torch.stack(gathered).mean(0), torch.tensor(expected), rtol=1e-5, atol=1e-6)
    # DDP saw only dense parameters; the optimizer too.
    optimized = {id(p) for g in trainer.optimizers[0].param_groups for p in g["params"]}
    assert optimized == {id(p) for p in model.parameters()}
    assert not any(".embedding_bags." in n for n, _ in model.named_parameters())
    reference_params = dict(reference.named_parameters())
    for name, param in model.named_parameters():
        torch.testing.assert_close(param, reference_params[name], rtol=1e-5, atol=1e-6, msg=lambda m: f"{name}: {m}")
    sharded = model.embedding_modules()[EMBEDDING_PATH]
    assert isinstance(sharded, ShardedEmbeddingBagCollection)
    full = reference.model.sparse_arch.embedding_bag_collection.embedding_bags
    shards = sharded.local_shards()
    assert shards, "every rank holds at least the DP table"
    for shard in shards:
        want = full[f"t_{shard.table}"].weight.detach()[shard.rows, shard.col_start : shard.col_end]
        torch.testing.assert_close(shard.weight, want, rtol=1e-5, atol=1e-6, msg=lambda m: f"{shard.table}: {m}")


def check_learns(rank: int, world: int, synthetic: Any, precision: str, strategy_name: str = "embark") -> None:
    register_strategies()
    spec = synthetic.tiny_spec(rows=1500)
    batches = synthetic.synthetic_batches(spec, num_batches=STEPS, batch_size=256, seed=rank)
    model = _model(spec, dense_lr=0.1, sparse_lr=0.1)
    record = _Losses()
    trainer = _trainer(world, STEPS, [record], strategy_name, precision=precision)
    trainer.fit(model, DataLoader(synthetic.BatchDataset(batches), batch_size=None))
    losses = record.losses
    assert len(losses) == STEPS
    assert sum(losses[-8:]) / 8 < sum(losses[:8]) / 8 - 0.1, losses
    strategy = trainer.strategy
    assert isinstance(strategy, EmbarkStrategy) and strategy.plan is not None
    assert strategy.plan.world_size == world and "f0:" in strategy.plan_summary()
    summaries = [None] * world
    dist.all_gather_object(summaries, strategy.plan_summary())
    assert len(set(summaries)) == 1, "every rank executes the plan rank 0 made"
    if strategy_name == "embark-torchrec-plan":  # torchrec's layout: fp32 RB (and DP) clusters only
        assert {(c.type, c.forward_compression) for c in strategy.plan.clusters} <= {
            (ClusterType.RB, Compression.FP32), (ClusterType.DP, Compression.FP32),
        }  # fmt: skip
    metrics = trainer.validate(model, DataLoader(synthetic.BatchDataset(batches[:2]), batch_size=None), verbose=False)
    assert 0.0 <= metrics[0]["val_auc"] <= 1.0


@pytest.mark.multiprocess
def test_two_ranks_learn_with_automatic_plan(synthetic) -> None:
    run_gloo_ranks(check_learns, 2, synthetic, "32-true")


@pytest.mark.multiprocess
def test_two_ranks_learn_with_torchrec_planners_plan(synthetic) -> None:
    run_gloo_ranks(check_learns, 2, synthetic, "32-true", "embark-torchrec-plan")


@pytest.mark.multiprocess
def test_two_ranks_bf16_mixed_dense_learns(synthetic) -> None:
    run_gloo_ranks(check_learns, 2, synthetic, "bf16-mixed")


@pytest.mark.multiprocess
@pytest.mark.parametrize("sparse", ["sgd", "rowwise_adagrad", "adagrad"])
def test_two_ranks_equal_single_process_training(synthetic, sparse: str) -> None:
    run_gloo_ranks(check_exact, 2, synthetic, 2, 4, sparse)


@pytest.mark.multiprocess
def test_four_ranks_two_hosts_equal_single_process_training(synthetic) -> None:
    run_gloo_ranks(check_exact, 4, synthetic, 2, 3)
