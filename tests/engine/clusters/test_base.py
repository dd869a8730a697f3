"""The cluster plug point: make_cluster picks the class of the plan's cluster type, and
every cluster's stores cover its local blocks exactly once, in local_blocks order.

Built on 2 gloo ranks (RB and UB clusters need a process group for their exchange)
from the all-layouts scenario, which puts every layout (replicated and column-split
included) into one cluster next to a DP cluster.
"""

from __future__ import annotations

import pytest
import torch

from lightning_embark.engine._optimizer import OptimizerKind, SparseOptimizer
from lightning_embark.engine._tables import build_routes, tables_of
from lightning_embark.engine.clusters import (
    DPCluster,
    EngineOptions,
    RBCluster,
    UBCluster,
    make_cluster,
)
from lightning_embark.engine.clusters._remote import RemoteCluster
from lightning_embark.plan._types import ClusterType
from lightning_embark.testing._ranks import run_gloo_ranks
from lightning_embark.testing._scenarios import all_layouts_plan

KINDS = {ClusterType.DP: DPCluster, ClusterType.RB: RBCluster, ClusterType.UB: UBCluster}


def test_engine_options_defaults() -> None:
    options = EngineOptions(optimizer=SparseOptimizer())
    assert (options.store, options.group, options.ranks_per_host, options.weighted) == (
        "auto",
        None,
        1,
        False,
    )


def _check_clusters(rank: int, world: int) -> None:
    for main in ("rb", "ub"):
        for kind, store in (
            (OptimizerKind.SGD, "auto"),  # fbgemm's table-batched store where it runs
            (OptimizerKind.ROWWISE_ADAGRAD, "torch"),
        ):
            scenario = all_layouts_plan(world, 2, main)
            tables, features, plan = tables_of(scenario.tables, scenario.plan)
            options = EngineOptions(
                optimizer=SparseOptimizer(kind=kind), store=store, ranks_per_host=2
            )
            seen = set()
            for routes, _ in build_routes(tables, features, plan):
                cluster = make_cluster(routes, rank, options)
                label = f"{main} {kind} cluster {cluster.name}"
                seen.add(routes.cluster.type)
                assert type(cluster) is KINDS[routes.cluster.type], label
                assert cluster.exchanges is (routes.cluster.type is not ClusterType.DP)
                assert (cluster.rank, cluster.routes, cluster.name) == (
                    rank,
                    routes,
                    routes.cluster.name,
                )
                _check_stores(cluster, label)
                if isinstance(cluster, RemoteCluster):
                    _check_synced(cluster, kind, label)
            assert seen == {ClusterType.DP, ClusterType(main)}


def _check_stores(cluster, label: str) -> None:
    """The stores' indices partition local_blocks; loading a store shows through local_blocks."""
    blocks = cluster.local_blocks()
    assert len(blocks) == len(cluster.routes.blocks[cluster.rank]) > 0, label
    indices = [i for _, idx in cluster.stores() for i in idx]
    assert sorted(indices) == list(range(len(blocks))), label
    for s, (store, idx) in enumerate(cluster.stores()):
        store.load(
            [
                torch.full((blocks[i][0].num_rows, blocks[i][0].width), float(100 * s + i))
                for i in idx
            ]
        )
    for s, (_, idx) in enumerate(cluster.stores()):
        for i in idx:
            block, weight = cluster.local_blocks()[i]
            assert weight.shape == (block.num_rows, block.width), label
            assert bool((weight == 100 * s + i).all()), f"{label} block {i}"


def _check_synced(cluster: RemoteCluster, kind: OptimizerKind, label: str) -> None:
    """The second store holds exactly the blocks whose update needs other ranks: replicated
    ones, and column-split ones under row-wise Adagrad."""
    tables = cluster.routes.tables
    expected = [
        i
        for i, (block, _) in enumerate(cluster.local_blocks())
        if tables[block.table].layout.num_replicas > 1
        or (
            kind is OptimizerKind.ROWWISE_ADAGRAD and tables[block.table].layout.num_col_shards > 1
        )
    ]
    (_, fused), (_, synced) = cluster.stores()
    assert synced == expected, label
    assert expected, f"{label}: the scenario has replicated blocks on every rank"
    assert set(fused).isdisjoint(synced)


@pytest.mark.multiprocess
def test_make_cluster_picks_the_type_and_stores_cover_every_block_once() -> None:
    run_gloo_ranks(_check_clusters, 2)


def test_nonfinite_counts_stay_on_the_device_until_read() -> None:
    """An encoder's count is added where it was made (one total per thread that encodes),
    with no host read until :attr:`Cluster.nonfinite` asks: on a GPU each read would make
    the host wait for the stream."""
    import threading

    from lightning_embark.accounting import DispatchCounter

    scenario = all_layouts_plan(1, 1, "rb")
    tables, features, plan = tables_of(scenario.tables, scenario.plan)
    # A DP cluster: built without a process group (the count lives in the base class).
    routes = next(
        r for r, _ in build_routes(tables, features, plan) if r.cluster.type is ClusterType.DP
    )
    cluster = make_cluster(routes, 0, EngineOptions(optimizer=SparseOptimizer(), store="torch"))
    counts = [torch.full((), n, dtype=torch.int64) for n in (2, 3, 4)]
    counter = DispatchCounter()
    with counter.counting():
        cluster.count_nonfinite(counts[0])
        cluster.count_nonfinite(counts[1])
        cluster.count_nonfinite(0)  # a block the reference proved finite
        lane = threading.Thread(target=cluster.count_nonfinite, args=(counts[2],))
        lane.start()
        lane.join()
    assert counter.snapshot().device_syncs == 0
    assert cluster.nonfinite == 9
    assert int(counts[0]) == 2  # the encoder's own count is left as it was
