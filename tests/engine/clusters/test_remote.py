"""RemoteCluster's status word: a rank whose batch failed validation still sends its header,
with status -1, and every rank raises after that one collective (nothing else is sent).

tests/engine/test_sharded_edges.py covers one rank with an out-of-range ID through the
module. Here: several bad ranks at once next to a valid rank with no samples (status 0
is not a failure), the exact header bytes of the failing step, the bad rank's own error
raised as given, a good step right after; through the module, a missing feature, and a
plan without exchanging clusters (the error stays local, peers are unaffected).
Weights are multiples of 1/4, so pooled sums are exact and compared with ``torch.equal``.
"""

from __future__ import annotations

import pytest
import torch
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from lightning_embark.accounting import CommCounter, counting_collectives
from lightning_embark.engine._batch import FeatureBatch
from lightning_embark.engine._jagged import JaggedBatch
from lightning_embark.engine._optimizer import SparseOptimizer
from lightning_embark.engine._routing import ClusterRoutes, FeatureInfo, TableInfo
from lightning_embark.engine.clusters import EngineOptions, make_cluster
from lightning_embark.errors import ConfigError
from lightning_embark.plan import layouts
from lightning_embark.plan._types import ClusterPlan, Plan
from lightning_embark.testing._ranks import run_gloo_ranks
from lightning_embark.torchrec_modules import ShardedEmbeddingBagCollection

WORLD = 3
SGD = SparseOptimizer()
ROWS = {"a": 9, "b": 5}


def _routes(kind: str) -> ClusterRoutes:
    """a: row-split over ranks 0, 1, 2; b: on rank 2. One host of 3 ranks."""
    tables = [
        TableInfo(name="a", num_rows=9, dim=4, layout=layouts.row_wise("a", "main", [0, 1, 2])),
        TableInfo(name="b", num_rows=5, dim=4, layout=layouts.table_wise("b", "main", 2)),
    ]
    features = [FeatureInfo(name="a", table="a"), FeatureInfo(name="b", table="b")]
    return ClusterRoutes(ClusterPlan(name="main", type=kind), tables, features, WORLD)


#: Header bytes each rank sends: int64 [status, one count per request] to each peer.
#: Every rank asks each owner for a's row shard there, and rank 2 for b too:
#: rank 0 -> 1: 8 * 2, -> 2: 8 * 3; rank 1 likewise; rank 2 -> 0 and -> 1: 8 * 2 each.
HEADER_BYTES = {0: 40, 1: 40, 2: 32}

FULL = {
    n: torch.randint(-8, 9, (ROWS[n], 4), generator=torch.Generator().manual_seed(i)) / 4
    for i, n in enumerate(ROWS)
}


def _good_batch(rank: int) -> list[FeatureBatch]:
    sizes = [2, 0, 3]
    gen = torch.Generator().manual_seed(rank)
    out = []
    for name in ("a", "b"):
        lengths = torch.randint(0, 4, (sizes[rank],), generator=gen)
        values = torch.randint(0, ROWS[name], (int(lengths.sum()),), generator=gen)
        out.append(FeatureBatch(values=values, lengths=lengths))
    return out


def _expected(batch: list[FeatureBatch]) -> list[torch.Tensor]:
    out = []
    for name, fb in zip(("a", "b"), batch, strict=True):
        pooled = torch.zeros(fb.batch_size, 4).index_add_(0, fb.bag_of(), FULL[name][fb.values])
        out.append(pooled)
    return out


def _status(rank: int, world: int) -> None:
    for kind, bad in (("rb", {0, 2}), ("ub", {1})):
        routes = _routes(kind)
        cluster = make_cluster(
            routes, rank, EngineOptions(optimizer=SGD, store="torch", ranks_per_host=WORLD)
        )
        for block, weight in cluster.local_blocks():
            table = routes.tables[block.table]
            with torch.no_grad():
                weight.copy_(FULL[table.name][table.global_rows(block.row_shard)])
        # A valid rank may have no samples: its status word 0 is no failure.
        empty = JaggedBatch.empty(2, 0, torch.device("cpu"))
        counter = CommCounter(rank=rank, ranks_per_host=WORLD)
        with counting_collectives(counter):
            if rank in bad:
                error = ConfigError(f"rank {rank}'s batch is bad")
                with pytest.raises(ConfigError) as caught:
                    cluster.forward(empty, keep_for_backward=True, error=error)
                assert caught.value is error  # its own error, raised after the header
            else:
                listed = ", ".join(str(r) for r in sorted(bad))
                with pytest.raises(
                    ConfigError,
                    match=rf"cluster 'main': rank\(s\) \[{listed}\] rejected their local batch",
                ):
                    cluster.forward(empty, keep_for_backward=True)
        sent = counter.reset()
        assert list(sent.by_collective) == ["all_to_all_single"], kind
        assert sent.by_collective["all_to_all_single"].calls == 1, kind  # the header only
        assert (sent.intra_host_bytes, sent.inter_host_bytes) == (HEADER_BYTES[rank], 0), kind
        # Nothing is left in flight: the next step runs normally on every rank.
        batch = _good_batch(rank)
        jagged = JaggedBatch.from_features(batch, batch[0].batch_size, torch.device("cpu"))
        dense, _ = cluster.forward(jagged, keep_for_backward=False)
        for got, want in zip(dense.split(4, dim=1), _expected(batch), strict=True):
            assert torch.equal(got, want), kind


@pytest.mark.multiprocess
def test_bad_ranks_send_a_status_word_and_every_rank_raises_after_the_header() -> None:
    run_gloo_ranks(_status, WORLD)


# ----------------------------------------------------------------- through the module

CONFIGS = [
    EmbeddingBagConfig(name="t_a", num_embeddings=9, embedding_dim=4, feature_names=["a"]),
    EmbeddingBagConfig(name="t_b", num_embeddings=5, embedding_dim=4, feature_names=["b"]),
]


def _plan(clusters: tuple[ClusterPlan, ...], tables) -> Plan:
    return Plan(world_size=2, ranks_per_host=2, clusters=clusters, tables=tables)


def _kjt(keys: list[str], rank: int) -> KeyedJaggedTensor:
    gen = torch.Generator().manual_seed(rank)
    lengths = torch.randint(0, 3, (2 * len(keys),), generator=gen)
    values = torch.randint(0, 5, (int(lengths.sum()),), generator=gen)
    return KeyedJaggedTensor(keys=keys, values=values, lengths=lengths, stride=2)


def _missing_feature(rank: int, world: int) -> None:
    ebc = EmbeddingBagCollection(tables=CONFIGS)
    exchanged = _plan(
        (ClusterPlan(name="rb", type="rb"),),
        (layouts.row_wise("a", "rb", [0, 1]), layouts.table_wise("b", "rb", 1)),
    )
    sharded = ShardedEmbeddingBagCollection.from_ebc(ebc, exchanged, sparse_optimizer=SGD)
    if rank == 1:
        with pytest.raises(ConfigError, match=r"features \['b'\] are missing from the batch"):
            sharded(_kjt(["a"], rank))
    else:
        with pytest.raises(ConfigError, match=r"cluster 'rb': rank\(s\) \[1\] rejected"):
            sharded(_kjt(["a", "b"], rank))
    # DP only: no cluster exchanges, so the bad rank raises alone and its peer carries on.
    local = _plan(
        (ClusterPlan(name="dp", type="dp"),),
        (layouts.data_parallel("a", "dp", 2), layouts.data_parallel("b", "dp", 2)),
    )
    sharded = ShardedEmbeddingBagCollection.from_ebc(ebc, local, sparse_optimizer=SGD)
    with torch.no_grad():
        if rank == 0:
            with pytest.raises(ConfigError, match=r"features \['a'\] are missing"):
                sharded(_kjt(["b"], rank))
        else:
            batch = _kjt(["a", "b"], rank)
            # bags of at most 2 IDs: one fp32 addition, the same in any order
            assert torch.equal(sharded(batch).values(), ebc(batch).values())


@pytest.mark.multiprocess
def test_a_missing_feature_fails_every_exchanging_rank_and_only_its_own_without_exchange() -> None:
    run_gloo_ranks(_missing_feature, 2)
