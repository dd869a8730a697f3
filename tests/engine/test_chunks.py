"""Optimizer state of the stores, and blocks <-> full-table rectangles under any plan."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torchrec.modules.embedding_configs import EmbeddingBagConfig

from lightning_embark.engine import EngineConfig
from lightning_embark.engine._chunks import apply_chunks, load_targets, save_chunks
from lightning_embark.engine._optimizer import OptimizerKind, SparseOptimizer
from lightning_embark.engine.stores import Bags, GroupedStore, TorchStore, make_store
from lightning_embark.engine.stores._fbgemm_store import fbgemm_available
from lightning_embark.plan import layouts
from lightning_embark.plan._types import ClusterPlan, ClusterType, Plan, RowSplit
from lightning_embark.testing._ranks import run_gloo_ranks
from lightning_embark.torchrec_modules import ShardedEmbeddingBagCollection

STORES = [
    "torch",
    pytest.param("fbgemm", marks=pytest.mark.skipif(not fbgemm_available(), reason="no fbgemm")),
]


def _train(store, steps: int = 3) -> None:
    g = torch.Generator().manual_seed(5)
    for _ in range(steps):
        rows = [torch.tensor([0, 2, 3]), torch.tensor([1, 4])]
        grads = [
            torch.randn(r.numel(), w, generator=g)
            for r, (_, w) in zip(rows, store.shapes, strict=True)
        ]
        store.apply_row_grads(rows, grads)


@pytest.mark.parametrize("store", STORES)
@pytest.mark.parametrize("kind", list(OptimizerKind))
@pytest.mark.parametrize("grouped", [False, True])
def test_store_state_round_trip_continues_identically(
    store: str, kind: OptimizerKind, grouped: bool
) -> None:
    optimizer = SparseOptimizer(kind=kind, lr=0.1)
    shapes = [(5, 4), (6, 8)]

    def make():
        if grouped:
            return GroupedStore([make_store(store, [s], optimizer) for s in shapes], [[0], [1]])
        return make_store(store, shapes, optimizer)

    first = make()
    first.load([torch.randn(r, w, generator=torch.Generator().manual_seed(r)) for r, w in shapes])
    _train(first)
    states = first.optimizer_state()
    assert len(states) == 2
    if kind is OptimizerKind.SGD:
        assert states == [None, None]
    else:
        assert all(s is not None and s.abs().sum() > 0 for s in states)
        assert [tuple(s.shape) for s in states] == (
            [(5,), (6,)] if kind is OptimizerKind.ROWWISE_ADAGRAD else shapes
        )
    second = make()
    second.load([w.clone() for w in first.weights()])
    second.load_optimizer_state([s.clone() if s is not None else None for s in states])
    for a, b in zip(first.optimizer_state(), second.optimizer_state(), strict=True):
        assert (a is None and b is None) or torch.equal(a, b)
    _train(first)
    _train(second)
    for a, b in zip(first.weights(), second.weights(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    # A store whose state was not restored diverges (the check above can fail).
    if kind is not OptimizerKind.SGD:
        fresh = make()
        fresh.load([w.clone() for w in second.weights()])
        _train(fresh)
        _train(second)
        assert not all(
            torch.equal(a, b) for a, b in zip(fresh.weights(), second.weights(), strict=True)
        )


def test_torch_store_pooled_unchanged_by_state_methods() -> None:
    store = TorchStore([(4, 4)], SparseOptimizer(kind=OptimizerKind.ADAGRAD))
    store.load([torch.arange(16.0).reshape(4, 4)])
    store.load_optimizer_state([torch.ones(4, 4)])
    out, _ = store.pooled(
        [Bags(indices=torch.tensor([0, 3]), offsets=torch.tensor([0, 2]))], keep_for_backward=False
    )
    torch.testing.assert_close(out[0], torch.tensor([[12.0, 14.0, 16.0, 18.0]]))


# --- blocks <-> full tables on 2 gloo ranks ------------------------------------------------

ROWS = [37, 40, 29, 21, 33]
DIM = 8


def _configs() -> list[EmbeddingBagConfig]:
    return [
        EmbeddingBagConfig(
            name=f"t_f{i}", embedding_dim=DIM, num_embeddings=rows, feature_names=[f"f{i}"]
        )
        for i, rows in enumerate(ROWS)
    ]


def _plan(variant: str) -> Plan:
    clusters = (
        ClusterPlan(name="dp", type=ClusterType.DP),
        ClusterPlan(name="rb", type=ClusterType.RB),
        ClusterPlan(name="ub", type=ClusterType.UB),
    )
    if variant == "a":
        tables = (
            layouts.row_wise("f0", "ub", [0, 1]),  # hash
            layouts.column_wise("f1", "rb", [0, 1]),
            layouts.grid("f2", "rb", [[0, 1], [1, 0]]),  # hash rows x columns
            layouts.data_parallel("f3", "dp", 2),
            layouts.replicated("f4", "rb", [[0, 1], [1, 0]], num_row_shards=2),  # r=2, hash
        )
    else:
        tables = (
            layouts.row_wise("f0", "rb", [1, 0], split=RowSplit.RANGE),
            layouts.table_wise("f1", "ub", 1),
            layouts.row_wise("f2", "ub", [1, 0]),  # hash, other owners
            layouts.table_wise("f3", "rb", 0),
            layouts.data_parallel("f4", "dp", 2),
        )
    return Plan(world_size=2, ranks_per_host=2, clusters=clusters, tables=tables)


def _full_state(kind: OptimizerKind, rows: int, seed: int) -> torch.Tensor | None:
    g = torch.Generator().manual_seed(seed)
    if kind is OptimizerKind.ROWWISE_ADAGRAD:
        return torch.rand(rows, generator=g)
    if kind is OptimizerKind.ADAGRAD:
        return torch.rand(rows, DIM, generator=g)
    return None


def _blocks_round_trip(rank: int, world: int, kind: OptimizerKind, store: str) -> None:
    optimizer = SparseOptimizer(kind=kind, lr=0.1)
    weights = {
        f"t_f{i}": torch.randn(r, DIM, generator=torch.Generator().manual_seed(i))
        for i, r in enumerate(ROWS)
    }
    states = {f"f{i}": _full_state(kind, r, 100 + i) for i, r in enumerate(ROWS)}
    first = ShardedEmbeddingBagCollection(
        _configs(),
        _plan("a"),
        sparse_optimizer=optimizer,
        weights=weights,
        config=EngineConfig(store=store),
    )
    shards = first.local_shards()
    block_states = []
    for s in shards:
        full = states[s.table]
        block_states.append(
            None
            if full is None
            else full[s.rows]
            if full.dim() == 1
            else full[s.rows, s.col_start : s.col_end]
        )
    first.load_local_shards([s.weight.clone() for s in shards], block_states)

    # Saved rectangles, gathered from both ranks, tile the full tables exactly once.
    saved = save_chunks(first)
    everything: list = [None] * world
    dist.all_gather_object(
        everything,
        [
            (
                t.table,
                [(c.offsets, c.tensor) for c in t.weights],
                [(c.offsets, c.tensor) for c in t.states],
            )
            for t in saved
        ],
    )
    for i, rows in enumerate(ROWS):
        name = f"f{i}"
        weight = torch.full((rows, DIM), float("nan"))
        state = None if states[name] is None else torch.full_like(states[name], float("nan"))
        for per_rank in everything:
            for table, weight_chunks, state_chunks in per_rank:
                if table != name:
                    continue
                for (r0, c0), t in weight_chunks:
                    assert weight[r0 : r0 + t.shape[0], c0 : c0 + t.shape[1]].isnan().all(), (
                        "overlap"
                    )
                    weight[r0 : r0 + t.shape[0], c0 : c0 + t.shape[1]] = t
                for offsets, t in state_chunks:
                    assert state is not None
                    target = state[offsets[0] : offsets[0] + t.shape[0]]
                    target = (
                        target if t.dim() == 1 else target[:, offsets[1] : offsets[1] + t.shape[1]]
                    )
                    target.copy_(t)
        torch.testing.assert_close(weight, weights[f"t_{name}"], rtol=0, atol=0)
        if state is not None:
            torch.testing.assert_close(state, states[name], rtol=0, atol=0)

    # Loading the full tables under another plan puts every row where that plan wants it.
    second = ShardedEmbeddingBagCollection(
        _configs(),
        _plan("b"),
        sparse_optimizer=optimizer,
        config=EngineConfig(seed=7, store=store),
    )
    targets = load_targets(second, with_state={f"f{i}": True for i in range(len(ROWS))})
    for t in targets:
        for c in t.weights:
            r0, c0 = c.offsets
            c.tensor.copy_(
                weights[f"t_{t.table}"][r0 : r0 + c.tensor.shape[0], c0 : c0 + c.tensor.shape[1]]
            )
        for c in t.states:
            full = states[t.table][c.offsets[0] : c.offsets[0] + c.tensor.shape[0]]
            c.tensor.copy_(
                full
                if c.tensor.dim() == 1
                else full[:, c.offsets[1] : c.offsets[1] + c.tensor.shape[1]]
            )
    apply_chunks(second, targets)
    for s in second.local_shards():
        torch.testing.assert_close(
            s.weight, weights[f"t_{s.table}"][s.rows, s.col_start : s.col_end], rtol=0, atol=0
        )
        full = states[s.table]
        if full is None:
            assert s.optimizer_state is None
        else:
            want = full[s.rows] if full.dim() == 1 else full[s.rows, s.col_start : s.col_end]
            torch.testing.assert_close(s.optimizer_state, want, rtol=0, atol=0)


@pytest.mark.multiprocess
@pytest.mark.parametrize(
    ("kind", "store"),
    [
        (OptimizerKind.ROWWISE_ADAGRAD, "auto"),
        (OptimizerKind.ADAGRAD, "torch"),
        (OptimizerKind.SGD, "auto"),
    ],
)
def test_blocks_round_trip_through_full_tables_under_another_plan(
    kind: OptimizerKind, store: str
) -> None:
    run_gloo_ranks(_blocks_round_trip, 2, kind, store)
