"""``Trainer.fit`` with ``strategy="embark"`` on gloo ranks: it learns, and it is exact.

Exactness: N steps on W ranks, each fed its slice of the global batches, must equal
single-process training of the same DLRMModule (same initial weights) on the global
batches: per-step loss (mean over ranks), dense weights and every embedding block
after training, for SGD, Adagrad and row-wise Adagrad (the strategy averages embedding
gradients over ranks as DDP does dense ones).

"Equal" is fp32 arithmetic in another order, bounded element by element from the
arithmetic (:mod:`lightning_embark.testing._tolerance`). Every parameter's gradient is
a sum over the global batch's samples; the two runs add its terms in another order
(``2 gamma(n - 1) sum(|terms|)``), and the terms themselves come out of a forward and
backward through the dense layers, whose dot products (``K`` summed fan-ins) put a
relative ``gamma(K)`` on each. ``sum(|terms|)`` is measured in the single-process run:
for embedding rows from the pooled output's gradient, for a linear layer's weight as
``|dY|^T |X|``. The optimizer turns that into a weight bound per step; the loss may
then differ by ``sum(|grad| * weight bound)`` plus its own rounding. Adagrad runs with
``eps = lr``: its slope ``lr / eps`` would otherwise turn a gradient that cancels down to
~``eps`` (this data has one of 1.9e-8 in table f3's first step) into an update ~5e6
times its fp32 rounding, which CPUs with other summation kernels do not reproduce.
The bound is first order: a weight that differs by the bound changes later gradients
by a product of two small terms, which is left out.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from lightning.pytorch import Callback, Trainer
from torch.utils.data import DataLoader
from torchrec.datasets.utils import Batch

from lightning_embark.engine import OptimizerKind, SparseOptimizer
from lightning_embark.models import EMBEDDING_PATH, DLRMModule
from lightning_embark.plan import TowerModule, layouts
from lightning_embark.plan._types import ClusterPlan, ClusterType, Compression, Plan
from lightning_embark.registry import register_strategies
from lightning_embark.strategies import EmbarkStrategy
from lightning_embark.testing import quiet_trainer
from lightning_embark.testing._ranks import run_gloo_ranks
from lightning_embark.testing._scenarios import concat_batches
from lightning_embark.testing._tolerance import (
    U,
    assert_within,
    gamma,
    gradient_terms,
    rounding_bound,
    step_bound,
    summation_bound,
)
from lightning_embark.testing._tower_scenarios import four_table_towers_plan
from lightning_embark.torchrec_modules import ShardedEmbeddingBagCollection

BATCH = 16  # per rank (exactness)
STEPS = 40  # learning
EXACT_LR = 0.05  # Adagrad's eps too (see the module docstring)


class _Losses(Callback):
    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.losses.append(float(outputs["loss"]))


def _model(spec: Any, **overrides: Any) -> DLRMModule:
    torch.manual_seed(0)
    config = dict(
        dense_arch_layer_sizes=[16], over_arch_layer_sizes=[16, 1], dense_lr=0.05, sparse_lr=0.05
    )
    return DLRMModule(spec, **(config | overrides))


def _trainer(
    world: int, steps: int, callbacks: list[Callback], strategy: Any, **kwargs: Any
) -> Trainer:
    return quiet_trainer(
        strategy=strategy,
        devices=world,
        max_steps=steps,
        use_distributed_sampler=False,
        callbacks=callbacks,
        **kwargs,
    )


def _mixed_plan(world: int, ranks_per_host: int) -> Plan:
    """RB table-wise and column-wise, UB row-wise (hash), DP: one table each."""
    hierarchical = world > ranks_per_host
    return Plan(
        world_size=world,
        ranks_per_host=ranks_per_host,
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


@dataclass(kw_only=True)
class _Bounds:
    """The single-process run's losses and the derived bounds of the sharded run's."""

    losses: list[float] = field(default_factory=list)
    loss_bounds: list[float] = field(default_factory=list)
    weights: dict[str, torch.Tensor] = field(default_factory=dict)  # by parameter name


def _dense_terms(model: DLRMModule) -> tuple[dict[str, torch.Tensor], Any]:
    """Hooks collecting ``sum(|terms|)`` of every linear layer's weight and bias gradient."""
    found: dict[str, torch.Tensor] = {}
    handles = []
    for name, layer in model.named_modules():
        if not isinstance(layer, torch.nn.Linear):
            continue

        def keep(
            module: torch.nn.Module, inputs: Any, output: torch.Tensor, name: str = name
        ) -> None:
            x = inputs[0].detach().abs().double()

            def on_grad(grad: torch.Tensor) -> None:
                g = grad.detach().abs().double()
                found[f"{name}.weight"] = g.t() @ x
                found[f"{name}.bias"] = g.sum(0)

            output.register_hook(on_grad)

        handles.append(layer.register_forward_hook(keep))
    return found, handles


def _single_process(
    model: DLRMModule, batches: list[Batch], optimizer: SparseOptimizer
) -> _Bounds:
    """The oracle: plain single-process training of the module on the global batches,
    and the bounds the sharded run must stay within (see the module docstring)."""
    model.materialize_embeddings()
    dense_optimizer = model.configure_optimizers()
    ebc = model.model.sparse_arch.embedding_bag_collection
    configs = ebc.embedding_bag_configs()
    params = dict(model.named_parameters())
    fan_in = (
        sum(m.in_features for m in model.modules() if isinstance(m, torch.nn.Linear))
        + configs[0].embedding_dim
    )
    term_error = float(gamma(fan_in))
    order = {name: torch.zeros(p.shape, dtype=torch.float64) for name, p in params.items()}
    moved = {name: torch.zeros(p.shape, dtype=torch.float64) for name, p in params.items()}
    dense_terms, handles = _dense_terms(model)
    pooled_grad: list[torch.Tensor] = []

    def keep_pooled_grad(module: torch.nn.Module, inputs: Any, out: Any) -> None:
        out.values().register_hook(pooled_grad.append)

    hook = ebc.register_forward_hook(keep_pooled_grad)
    result = _Bounds()
    for batch in batches:
        dense_optimizer.zero_grad()
        pooled_grad.clear()
        logits = model(batch.dense_features, batch.sparse_features)
        per_sample = F.binary_cross_entropy_with_logits(
            logits, batch.labels.float(), reduction="none"
        )
        loss = per_sample.mean()
        loss.backward()
        weight_bound = {n: order[n] + rounding_bound(params[n].detach(), moved[n]) for n in params}
        result.loss_bounds.append(
            sum(
                float((params[n].grad.double().abs() * weight_bound[n]).sum())
                for n in params
                if params[n].grad is not None
            )
            + float(
                summation_bound(per_sample.detach().abs().sum(), torch.tensor(len(per_sample)))
                / len(per_sample)
            )
            + term_error * float(loss.abs())
            + 8 * U * float(loss.abs())
        )
        before = {n: p.detach().clone() for n, p in params.items()}
        dense_optimizer.step()
        result.losses.append(float(loss))
        samples = torch.tensor(len(per_sample))
        embedding = gradient_terms(configs, batch.sparse_features, pooled_grad[0])
        for config in configs:
            name = f"{EMBEDDING_PATH}.embedding_bags.{config.name}.weight"
            abs_sum, count = embedding[config.name]
            order[name] = step_bound(order[name], optimizer, abs_sum, count, term_error=term_error)
        dense_spec = SparseOptimizer(
            kind=OptimizerKind(model.config.dense_optimizer), lr=EXACT_LR, eps=EXACT_LR
        )
        for name, abs_sum in dense_terms.items():
            order[name] = step_bound(
                order[name], dense_spec, abs_sum, samples, term_error=term_error
            )
        for n, p in params.items():
            moved[n] += (p.detach() - before[n]).abs()
    hook.remove()
    for h in handles:
        h.remove()
    result.weights = {n: order[n] + rounding_bound(params[n].detach(), moved[n]) for n in params}
    return result


def check_exact(
    rank: int,
    world: int,
    synthetic: Any,
    ranks_per_host: int,
    steps: int,
    sparse: str = "sgd",
    towers: bool = False,
) -> None:
    register_strategies()
    spec = synthetic.tiny_spec(rows=300)
    per_rank = [
        synthetic.synthetic_batches(spec, num_batches=steps, batch_size=BATCH, seed=10 + r)
        for r in range(world)
    ]
    lr = 0.5 if sparse == "sgd" else EXACT_LR
    model = _model(spec, sparse_optimizer=sparse, sparse_lr=lr, dense_lr=EXACT_LR, eps=EXACT_LR)
    model.materialize_embeddings()  # the same (seeded) tables for both runs
    reference = copy.deepcopy(model)
    engine_optimizer = SparseOptimizer(kind=OptimizerKind(sparse), lr=lr, eps=EXACT_LR)
    expected = _single_process(
        reference, [_global(per_rank, s) for s in range(steps)], engine_optimizer
    )

    record = _Losses()
    plan = (four_table_towers_plan if towers else _mixed_plan)(world, ranks_per_host)
    strategy = EmbarkStrategy(plan=plan)
    trainer = _trainer(world, steps, [record], strategy)
    trainer.fit(model, DataLoader(synthetic.BatchDataset(per_rank[rank]), batch_size=None))

    losses = torch.tensor(record.losses)
    gathered = [torch.zeros_like(losses) for _ in range(world)]
    dist.all_gather(gathered, losses)
    assert_within(
        torch.stack(gathered).mean(0),
        torch.tensor(expected.losses),
        torch.tensor(expected.loss_bounds),
        "per-step loss",
    )
    # DDP saw only dense parameters; the optimizer too.
    optimized = {id(p) for g in trainer.optimizers[0].param_groups for p in g["params"]}
    assert optimized == {id(p) for p in model.parameters()}
    assert not any(".embedding_bags." in n for n, _ in model.named_parameters())
    reference_params = dict(reference.named_parameters())
    for name, param in model.named_parameters():
        assert_within(param, reference_params[name], expected.weights[name], name)
    sharded = model.embedding_modules()[EMBEDDING_PATH]
    assert isinstance(sharded, ShardedEmbeddingBagCollection)
    full = reference.model.sparse_arch.embedding_bag_collection.embedding_bags
    shards = sharded.local_shards()
    assert shards, "every rank holds at least the DP table"
    for shard in shards:
        block = (shard.rows, slice(shard.col_start, shard.col_end))
        want = full[f"t_{shard.table}"].weight.detach()[block]
        bound = expected.weights[f"{EMBEDDING_PATH}.embedding_bags.t_{shard.table}.weight"][block]
        assert_within(shard.weight, want, bound, shard.table)


def check_learns(
    rank: int, world: int, synthetic: Any, precision: str, strategy_name: str = "embark"
) -> None:
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
    if (
        strategy_name == "embark-torchrec-plan"
    ):  # torchrec's layout: fp32 RB (and DP) clusters only
        assert {(c.type, c.forward_compression) for c in strategy.plan.clusters} <= {
            (ClusterType.RB, Compression.FP32),
            (ClusterType.DP, Compression.FP32),
        }
    metrics = trainer.validate(
        model, DataLoader(synthetic.BatchDataset(batches[:2]), batch_size=None), verbose=False
    )
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


@pytest.mark.multiprocess
@pytest.mark.parametrize("ranks_per_host", [2, 1])
def test_identity_towers_equal_single_process_training(synthetic, ranks_per_host: int) -> None:
    """The semantic-preserving transform through the Trainer: towers move where tables
    live and rows are pooled, not what is computed."""
    run_gloo_ranks(check_exact, 4, synthetic, ranks_per_host, 3, "rowwise_adagrad", True)


def check_automatic_towers(rank: int, world: int, synthetic: Any) -> None:
    register_strategies()
    spec = synthetic.tiny_spec(rows=300)
    batches = synthetic.synthetic_batches(spec, num_batches=3, batch_size=BATCH, seed=rank)
    model = _model(spec)
    strategy = EmbarkStrategy(towers="auto", topology="emulated")
    trainer = _trainer(world, 3, [], strategy)
    trainer.fit(model, DataLoader(synthetic.BatchDataset(batches), batch_size=None))
    plan = strategy.plan
    assert plan is not None and plan.tower_choice is not None
    choice = plan.tower_choice
    priced = [c for c in choice.candidates if c.step_ms is not None]
    chosen = min(priced, key=lambda c: (c.step_ms, c.towers))
    assert choice.chosen == chosen.label and len(plan.towers) == chosen.towers
    assert {c.module for c in choice.candidates if c.towers} == {TowerModule.IDENTITY}
    assert all(t.module is TowerModule.IDENTITY for t in plan.towers)
    assert f"towers: {choice.chosen} (" in strategy.plan_summary()


@pytest.mark.multiprocess
def test_automatic_towers_are_the_cost_models_choice(synthetic, monkeypatch) -> None:
    """``towers="auto"``: the plan is the cheapest of flat and identity towers (H, 2H, LH)
    by the cost model, the comparison kept in the plan and printed in its summary."""
    monkeypatch.setenv("EMBARK_RANKS_PER_HOST", "1")
    run_gloo_ranks(check_automatic_towers, 2, synthetic)
