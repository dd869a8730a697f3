"""Data-parallel clusters: placement check, local pooled lookups, one all-reduced update.

Weights and gradients are small multiples of 1/4 and mean-pooled bags have power-of-two
lengths, so every pooled value and SGD update (``lr = 1/4``) is exact in fp32 and
compared with ``torch.equal``.
"""

from __future__ import annotations

import pytest
import torch

from lightning_embark.engine._batch import FeatureBatch
from lightning_embark.engine._jagged import JaggedBatch
from lightning_embark.engine._optimizer import OptimizerKind, SparseOptimizer
from lightning_embark.engine._routing import ClusterRoutes, FeatureInfo, TableInfo
from lightning_embark.engine.clusters import DPCluster, EngineOptions
from lightning_embark.errors import ConfigError
from lightning_embark.plan import layouts
from lightning_embark.plan._types import ClusterPlan, ClusterType, Plan, TableLayout
from lightning_embark.spec import ModelSpec, TableSpec
from lightning_embark.testing._ranks import run_gloo_ranks

DP = ClusterPlan(name="dp", type=ClusterType.DP)
SGD = SparseOptimizer(kind=OptimizerKind.SGD, lr=0.25)
ROWS = {"x": 6, "y": 5}
DIMS = {"x": 4, "y": 8}


def _routes(world: int, layout_of=layouts.data_parallel) -> ClusterRoutes:
    """Tables x and y; features fx (x, sum), fy (y, mean), fx2 (x again, sum)."""
    tables = [
        TableInfo(name=n, num_rows=ROWS[n], dim=DIMS[n], layout=layout_of(n, "dp", world))
        for n in ("x", "y")
    ]
    features = [
        FeatureInfo(name="fx", table="x"),
        FeatureInfo(name="fy", table="y", pooling="mean"),
        FeatureInfo(name="fx2", table="x"),
    ]
    return ClusterRoutes(DP, tables, features, world)


def _full_tables(seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {n: torch.randint(-8, 9, (ROWS[n], DIMS[n]), generator=gen) / 4 for n in ("x", "y")}


def _load(cluster: DPCluster, full: dict[str, torch.Tensor]) -> None:
    for block, weight in cluster.local_blocks():
        with torch.no_grad():
            weight.copy_(full[cluster.routes.tables[block.table].name])


def _batch() -> list[FeatureBatch]:
    """4 samples: duplicates, empty bags, and mean bags of 1, 2 and 4 IDs."""
    return [
        FeatureBatch(values=torch.tensor([0, 5, 5, 2, 5]), lengths=torch.tensor([2, 0, 2, 1])),
        FeatureBatch(
            values=torch.tensor([1, 4, 4, 0, 1, 2, 4]), lengths=torch.tensor([1, 0, 2, 4])
        ),
        FeatureBatch(values=torch.tensor([3]), lengths=torch.tensor([0, 1, 0, 0])),
    ]


def _jagged(batch: list[FeatureBatch]) -> JaggedBatch:
    return JaggedBatch.from_features(batch, batch[0].batch_size, torch.device("cpu"))


def _pooled(table: torch.Tensor, fb: FeatureBatch, mean: bool) -> torch.Tensor:
    out, start = [], 0
    for n in fb.lengths.tolist():
        bag = table[fb.values[start : start + n]].sum(0)
        out.append(bag / max(n, 1) if mean else bag)
        start += n
    return torch.stack(out)


# ----------------------------------------------------------------- placement


def test_a_dp_table_whose_replica_g_is_not_on_rank_g_is_refused() -> None:
    swapped = TableLayout(table="x", cluster="dp", num_replicas=2, ranks=((1,), (0,)))
    # Plan.validate only checks (r, k, c): the engine's cluster is what refuses the swap.
    Plan(world_size=2, ranks_per_host=2, clusters=(DP,), tables=(swapped,)).validate(
        ModelSpec(
            name="m",
            tables=(TableSpec(name="x", num_embeddings=6, embedding_dim=4, pooling_factor=1.0),),
        )
    )
    routes = ClusterRoutes(
        DP,
        [TableInfo(name="x", num_rows=6, dim=4, layout=swapped)],
        [FeatureInfo(name="fx", table="x")],
        2,
    )
    with pytest.raises(
        ConfigError,
        match=r"table 'x' is in DP cluster 'dp' but replica g is not on rank g "
        r"\(ranks \(\(1,\), \(0,\)\)\); a DP table needs ranks=\[\[0\], \[1\], \.\.\., \[1\]\]",
    ):
        DPCluster(routes, 0, EngineOptions(optimizer=SGD))


def test_a_dp_table_with_fewer_replicas_than_ranks_is_refused() -> None:
    routes = _routes(2, lambda n, c, world: layouts.table_wise(n, c, 0))
    with pytest.raises(ConfigError, match="table 'x' is in DP cluster 'dp' but replica g"):
        DPCluster(routes, 0, EngineOptions(optimizer=SGD))


# ----------------------------------------------------------------- forward (no process group)


@pytest.mark.parametrize("store", ["auto", "torch"])
def test_forward_pools_every_feature_locally(store: str) -> None:
    cluster = DPCluster(_routes(1), 0, EngineOptions(optimizer=SGD, store=store))
    assert not cluster.exchanges
    ((store, indices),) = cluster.stores()
    assert store is cluster.store and indices == [0, 1]
    full = _full_tables()
    _load(cluster, full)
    batch = _batch()
    dense, _ = cluster.forward(_jagged(batch), keep_for_backward=False)
    pooled = torch.split(dense, [DIMS["x"], DIMS["y"], DIMS["x"]], dim=1)
    expected = [
        _pooled(full["x"], batch[0], mean=False),
        _pooled(full["y"], batch[1], mean=True),
        _pooled(full["x"], batch[2], mean=False),
    ]
    for got, want in zip(pooled, expected, strict=True):
        assert torch.equal(got, want)
    assert torch.equal(pooled[1][1], torch.zeros(8))  # an empty mean bag pools to 0


def test_a_batch_error_is_raised_at_once_without_any_collective() -> None:
    """No process group exists here: a DP cluster has nothing to tell its peers."""
    cluster = DPCluster(_routes(1), 0, EngineOptions(optimizer=SGD))
    error = ConfigError("bad batch")
    with pytest.raises(ConfigError) as caught:
        cluster.forward(_jagged(_batch()), keep_for_backward=True, error=error)
    assert caught.value is error


# ----------------------------------------------------------------- backward (2 ranks)


def _rank_batch(rank: int) -> list[FeatureBatch]:
    """2 samples per rank; both ranks touch x's row 5 and y's row 4."""
    if rank == 0:
        parts = [([0, 5, 5, 2], [3, 1]), ([1, 4], [1, 1]), ([3, 0], [0, 2])]
    else:
        parts = [([5, 1, 1], [1, 2]), ([4, 4, 4, 4], [4, 0]), ([2], [1, 0])]
    return [FeatureBatch(values=torch.tensor(v), lengths=torch.tensor(n)) for v, n in parts]


def _dense_grads(batch: list[FeatureBatch], grads: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """Gradient of ``sum(grads * pooled)`` w.r.t. the full tables (fy is mean-pooled)."""
    out = {n: torch.zeros(ROWS[n], DIMS[n]) for n in ("x", "y")}
    for (table, mean), fb, g in zip(
        (("x", False), ("y", True), ("x", False)), batch, grads, strict=True
    ):
        bag = fb.bag_of()
        scale = 1.0 / fb.lengths.clamp_min(1)[bag].unsqueeze(1) if mean else 1.0
        out[table].index_add_(0, fb.values, g[bag] * scale)
    return out


def _upstream(rank: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(10 + rank)
    return [torch.randint(-3, 4, (2, DIMS[t]), generator=gen).float() for t in ("x", "y", "x")]


def _backward(rank: int, world: int) -> None:
    cluster = DPCluster(_routes(world), rank, EngineOptions(optimizer=SGD))
    full = _full_tables()
    _load(cluster, full)
    _, ctx = cluster.forward(_jagged(_rank_batch(rank)), keep_for_backward=True)
    cluster.backward(ctx, torch.cat(_upstream(rank), dim=1))
    total = {n: torch.zeros(ROWS[n], DIMS[n]) for n in ("x", "y")}
    for r in range(world):  # every rank's gradient, all-reduced
        for n, g in _dense_grads(_rank_batch(r), _upstream(r)).items():
            total[n] += g
    for block, weight in cluster.local_blocks():
        name = cluster.routes.tables[block.table].name
        assert block.replica == rank
        assert torch.equal(weight, full[name] - 0.25 * total[name]), (rank, name)


@pytest.mark.multiprocess
def test_backward_applies_the_all_reduced_gradient_on_every_replica() -> None:
    run_gloo_ranks(_backward, 2)
