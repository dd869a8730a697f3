"""The sharded module against ONE unsharded EmbeddingBagCollection fed the global batch.

Every case puts all layouts (table-wise, row-wise hash / range, column-wise, grid,
table-row-wise, r=2 replicated, a shared table, data-parallel) into one plan and runs
3 optimizer steps on gloo ranks; several cases share one set of ranks to keep the
suite fast. Checked at every step: forward outputs for the rank's samples, and every
block's weights after the update (which folds in the gradient reaching the
embedding rows). Batches have empty bags, duplicate IDs, the last row, and at step 1
a rank with no samples.

In fp32 every weight and output must lie within a bound derived from the arithmetic
(:mod:`lightning_embark.testing._tolerance`): the sharded module adds the same gradient
terms and row-shard partials as the oracle in another order, which fp32 rounds
differently by at most ``2 gamma(n - 1) sum(|terms|)``, and the optimizer turns a
gradient difference into a weight difference of at most ``lr`` (SGD) or ``lr / eps``
(Adagrad, row-wise Adagrad) per step and path. The Adagrad cases train with ``eps =
lr`` so that slope stays 1: with a small ``eps`` a gradient that cancels down to ~``eps``
would amplify its rounding by ``lr / eps``, whichever CPU sums it. Compressed cases are
checked in relative norm against the codecs' error.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest
import torch
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from lightning_embark.engine import EngineConfig
from lightning_embark.engine._optimizer import OptimizerKind, SparseOptimizer
from lightning_embark.plan._types import Compression
from lightning_embark.testing._oracle import ReferenceOptimizer
from lightning_embark.testing._ranks import run_gloo_ranks
from lightning_embark.testing._scenarios import all_layouts_plan, concat_batches, random_batches
from lightning_embark.testing._tolerance import (
    assert_within,
    gradient_terms,
    pooled_bound,
    rounding_bound,
    step_bound,
)
from lightning_embark.torchrec_modules import ShardedEmbeddingBagCollection

RANKS_PER_HOST = 2
BATCH = 6
STEPS = 3

TOLERANCE = {  # relative norm; fp32 is also checked element-wise (rtol 1e-5)
    Compression.FP32: 1e-5,
    Compression.BF16: 1e-2,
    Compression.FP16: 1e-2,
    Compression.FP8: 5e-2,
    Compression.INT8: 5e-2,
}


@dataclass(frozen=True, kw_only=True)
class Case:
    cluster: str
    forward: Compression = Compression.FP32
    backward: Compression = Compression.FP32
    hierarchical: bool = False
    optimizer: OptimizerKind = OptimizerKind.ADAGRAD
    store: str = "auto"
    weighted: bool = False
    int32_inputs: bool = False

    @property
    def tolerance(self) -> float:
        return max(TOLERANCE[self.forward], TOLERANCE[self.backward])


def _close(
    actual: torch.Tensor, expected: torch.Tensor, tol: float, bound: torch.Tensor, what: str
) -> None:
    """fp32: within the derived element-wise ``bound``; compressed: within ``tol`` in relative
    norm."""
    if tol <= 1e-5:
        assert_within(actual, expected, bound, what)
        return
    error = (actual - expected).norm() / expected.norm().clamp_min(1e-12)
    assert error <= tol, f"{what}: relative norm error {error:.3g} > {tol}"


def check_case(rank: int, world: int, case: Case) -> None:
    scenario = all_layouts_plan(
        world,
        min(world, RANKS_PER_HOST),
        case.cluster,
        forward=case.forward,
        backward=case.backward,
        hierarchical=case.hierarchical,
        weighted=case.weighted,
    )
    torch.manual_seed(1234)  # the same full tables on every rank
    ebc = EmbeddingBagCollection(tables=scenario.tables, is_weighted=case.weighted)
    optimizer = SparseOptimizer(kind=case.optimizer, lr=0.05, eps=0.05)
    sharded = ShardedEmbeddingBagCollection.from_ebc(
        ebc, scenario.plan, sparse_optimizer=optimizer, config=EngineConfig(store=case.store)
    )
    reference = ReferenceOptimizer(ebc, optimizer)
    width = sum(t.embedding_dim * len(t.feature_names) for t in scenario.tables)
    tables = {c.name: ebc.embedding_bags[c.name].weight for c in scenario.tables}
    order_bound = {name: torch.zeros(w.shape, dtype=torch.float64) for name, w in tables.items()}
    moved = {name: torch.zeros(w.shape, dtype=torch.float64) for name, w in tables.items()}
    for step in range(STEPS):
        sizes = [BATCH] * world
        if step == 1 and world > 1:
            sizes[world - 1] = 0  # a rank with no samples
        local = random_batches(scenario, sizes, seed=100 * step + world, weighted=case.weighted)
        upstream = torch.randn(sum(sizes), width, generator=torch.Generator().manual_seed(step))
        start = sum(sizes[:rank])
        mine = slice(start, start + sizes[rank])

        global_batch = concat_batches(local)
        weight_bound = {
            name: order_bound[name] + rounding_bound(w.detach(), moved[name])
            for name, w in tables.items()
        }
        forward_bound = pooled_bound(scenario.tables, global_batch, tables, weight_bound)
        expected = ebc(global_batch)
        (expected.values() * upstream).sum().backward()
        before = {name: w.detach().clone() for name, w in tables.items()}
        reference.step()
        for name, (abs_sum, count) in gradient_terms(
            scenario.tables, global_batch, upstream
        ).items():
            order_bound[name] = step_bound(order_bound[name], optimizer, abs_sum, count)
            moved[name] += (tables[name].detach() - before[name]).abs()

        mine_batch = local[rank]
        if case.int32_inputs:  # torchrec allows int32 IDs and lengths
            mine_batch = KeyedJaggedTensor(
                keys=mine_batch.keys(),
                values=mine_batch.values().int(),
                lengths=mine_batch.lengths().int(),
                weights=mine_batch.weights_or_none(),
                stride=mine_batch.stride(),
            )
        out = sharded(mine_batch)
        assert out.keys() == expected.keys()
        assert out.length_per_key() == expected.length_per_key()
        _close(
            out.values(),
            expected.values()[mine].detach(),
            case.tolerance,
            forward_bound[mine],
            f"{case} step {step} forward",
        )
        (out.values() * upstream[mine]).sum().backward()
        for shard in sharded.local_shards():
            name = f"t_{shard.table}"
            block = (shard.rows, slice(shard.col_start, shard.col_end))
            bound = order_bound[name] + rounding_bound(tables[name].detach(), moved[name])
            _close(
                shard.weight,
                tables[name].detach()[block],
                case.tolerance,
                bound[block],
                f"{case} step {step} table {shard.table} block "
                f"({shard.replica},{shard.row_shard},{shard.col_shard})",
            )


def run_cases(rank: int, world: int, cases: list[Case]) -> None:
    for case in cases:
        check_case(rank, world, case)


FP32_CASES = [
    Case(cluster=c, optimizer=o, store=k)
    for c in ("rb", "ub")
    for o, k in (
        (OptimizerKind.SGD, "auto"),
        (OptimizerKind.ADAGRAD, "auto"),
        (OptimizerKind.ROWWISE_ADAGRAD, "auto"),
        (OptimizerKind.ADAGRAD, "torch"),
    )
] + [Case(cluster=c, weighted=True, int32_inputs=True) for c in ("rb", "ub")]

# SGD: the weight error is proportional to the gradient's quantisation error. (Adagrad's
# first steps are sign-like, so a gradient element quantised to 0 moves its weight by lr.)
COMPRESSED_CASES = [
    Case(cluster=c, forward=f, backward=f, optimizer=OptimizerKind.SGD)
    for c in ("rb", "ub")
    for f in (Compression.BF16, Compression.FP16, Compression.FP8, Compression.INT8)
] + [
    Case(
        cluster="rb",
        forward=Compression.FP8,
        backward=Compression.BF16,
        optimizer=OptimizerKind.SGD,
    )
]


@pytest.mark.multiprocess
def test_single_rank_matches_unsharded() -> None:
    cases = [
        Case(cluster=c, int32_inputs=True, optimizer=OptimizerKind.ROWWISE_ADAGRAD)
        for c in ("rb", "ub")
    ]
    run_gloo_ranks(run_cases, 1, cases)


@pytest.mark.multiprocess
def test_fp32_two_ranks_matches_unsharded() -> None:
    run_gloo_ranks(run_cases, 2, FP32_CASES)


@pytest.mark.multiprocess
def test_fp32_four_ranks_two_hosts_hierarchical_matches_unsharded() -> None:
    cases = [
        Case(cluster=c, hierarchical=h, optimizer=o)
        for c in ("rb", "ub")
        for h in (False, True)
        for o in (OptimizerKind.SGD, OptimizerKind.ROWWISE_ADAGRAD)
    ]
    cases += [Case(cluster=c, hierarchical=True, weighted=True) for c in ("rb", "ub")]
    run_gloo_ranks(run_cases, 4, cases)


@pytest.mark.multiprocess
def test_compressed_two_ranks_within_tolerance() -> None:
    run_gloo_ranks(run_cases, 2, COMPRESSED_CASES)


@pytest.mark.multiprocess
def test_compressed_four_ranks_hierarchical_within_tolerance() -> None:
    cases = [dataclasses.replace(c, hierarchical=True) for c in COMPRESSED_CASES]
    run_gloo_ranks(run_cases, 4, cases)
