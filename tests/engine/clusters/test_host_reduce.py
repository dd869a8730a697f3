"""HostReduce, RB's hierarchical rows exchange: its keys, its reduce, its gradient routing.

``reduce_keys`` is pure and checked by hand. On 4 gloo ranks (2 hosts x 2) a HostReduce
is driven directly with known fp32 payloads, then through the sharded module against an
unsharded ``EmbeddingBagCollection``. Every value is a small multiple of 1/4 (weights,
upstream gradients, SGD's ``lr = 1/4``), so every sum and update is exact in fp32 in any
order: results are compared with ``torch.equal``, bytes with ``==``.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from lightning_embark.accounting import CommCounter, counting_collectives
from lightning_embark.engine import EngineConfig
from lightning_embark.engine._optimizer import OptimizerKind, SparseOptimizer
from lightning_embark.engine._routing import ClusterRoutes, FeatureInfo, Request, TableInfo
from lightning_embark.engine.clusters._host_reduce import HostReduce, reduce_keys
from lightning_embark.plan import layouts
from lightning_embark.plan._types import ClusterPlan, ClusterType, Plan
from lightning_embark.testing._oracle import ReferenceOptimizer
from lightning_embark.testing._ranks import run_gloo_ranks
from lightning_embark.testing._scenarios import Scenario, concat_batches, random_batches
from lightning_embark.torchrec_modules import ShardedEmbeddingBagCollection
from lightning_embark.wire import codec_for

WORLD, LOCAL = 4, 2
FP32 = codec_for("fp32", backward=False)


def _routes() -> ClusterRoutes:
    """Slots fa (a), fb (b), fc (c), fa2 (a again) over 2 hosts x 2 ranks.

    a: rows split over host 0 (ranks 0, 1); b: 2 x 2 grid, row shard 0 on host 1
    (ranks 2, 3), row shard 1 on host 0 (ranks 0, 1); c: one replica per host, on
    ranks 1 and 3.
    """
    tables = [
        TableInfo(name="a", num_rows=10, dim=4, layout=layouts.table_row_wise("a", "c", 0, 2)),
        TableInfo(name="b", num_rows=10, dim=8, layout=layouts.grid("b", "c", [[2, 3], [0, 1]])),
        TableInfo(name="c", num_rows=6, dim=4, layout=layouts.replicated("c", "c", [[1], [3]])),
    ]
    features = [
        FeatureInfo(name="fa", table="a"),
        FeatureInfo(name="fb", table="b"),
        FeatureInfo(name="fc", table="c"),
        FeatureInfo(name="fa2", table="a"),
    ]
    cluster = ClusterPlan(name="c", type=ClusterType.RB, hierarchical=True)
    return ClusterRoutes(cluster, tables, features, WORLD)


def _summary(keys: list[tuple[tuple[int, int], Request]]) -> list[tuple]:
    """(key, representative's owner, row shard, width) per key."""
    return [(k, r.block.owner, r.block.row_shard, r.block.width) for k, r in keys]


def test_keys_are_sorted_with_one_representative_per_slot_and_column_shard() -> None:
    routes = _routes()
    # Owner 0 is met first (its keys (0,0), (1,0), (3,0)), owner 1 adds (1,1), (2,0):
    # the keys come back sorted, each represented by the first request found.
    assert _summary(reduce_keys(routes, 0, 0, LOCAL)) == [
        ((0, 0), 0, 0, 4),
        ((1, 0), 0, 1, 4),
        ((1, 1), 1, 1, 4),
        ((2, 0), 1, 0, 4),
        ((3, 0), 0, 0, 4),
    ]
    assert _summary(reduce_keys(routes, 0, 1, LOCAL)) == [((1, 0), 2, 0, 4), ((1, 1), 3, 0, 4)]


def test_keys_follow_the_requesters_replica_group() -> None:
    routes = _routes()
    # requesters 2, 3 read c's replica on rank 3 (host 1), not the one on rank 1
    assert [k for k, _ in reduce_keys(routes, 3, 1, LOCAL)] == [(1, 0), (1, 1), (2, 0)]
    assert [k for k, _ in reduce_keys(routes, 3, 0, LOCAL)] == [(0, 0), (1, 0), (1, 1), (3, 0)]
    assert [k for k, _ in reduce_keys(routes, 1, 1, LOCAL)] == [(1, 0), (1, 1)]


def test_a_host_without_blocks_for_the_requester_has_no_keys() -> None:
    tables = [TableInfo(name="a", num_rows=8, dim=4, layout=layouts.row_wise("a", "c", [0, 1]))]
    routes = ClusterRoutes(
        ClusterPlan(name="c", type="rb", hierarchical=True),
        tables,
        [FeatureInfo(name="a", table="a")],
        WORLD,
    )
    assert reduce_keys(routes, 2, 1, LOCAL) == []
    assert [k for k, _ in reduce_keys(routes, 2, 0, LOCAL)] == [(0, 0)]


# ----------------------------------------------------------------- HostReduce on 4 ranks

BATCH_SIZES = [2, 0, 3, 1]  # rank 1 has no samples


def _partial(owner: int, q: int, request: Request) -> torch.Tensor:
    """The pooled partial ``owner`` answers ``q`` for ``request``: distinct exact values."""
    b = request.block
    base = 1000 * owner + 100 * q + 10 * request.slot + 4 * b.row_shard + b.col_shard
    n = BATCH_SIZES[q] * b.width
    return (base + torch.arange(n, dtype=torch.float32) / 4).reshape(BATCH_SIZES[q], b.width)


def _grad(q: int, host: int, key: tuple[int, int], width: int) -> torch.Tensor:
    """The gradient slice ``q`` sends ``host`` for ``key`` (host-dependent to catch misroutes)."""
    base = 100 * q + 50 * host + 10 * key[0] + key[1]
    n = BATCH_SIZES[q] * width
    return -(base + torch.arange(n, dtype=torch.float32) / 4).reshape(BATCH_SIZES[q], width)


def _drive_host_reduce(rank: int, world: int) -> None:
    routes = _routes()
    reduce = HostReduce(routes, rank, LOCAL)
    assert (reduce.hosts, reduce.host, reduce.local) == (2, rank // 2, rank % 2)
    assert reduce.requesters_of(rank % 2) == [rank % 2, 2 + rank % 2]
    # Forward: this owner's encoded partials, per requester and request.
    payloads = [
        [FP32.encode(_partial(rank, q, r)).payload for r in routes.requests(q, rank)]
        for q in range(world)
    ]
    counted: list[int] = []
    received = reduce.forward(payloads, BATCH_SIZES, FP32, counted.append)
    assert counted == [0] * len(counted)  # finite fp32: nothing non-finite re-encoded
    start = 0
    for host in range(2):
        for key, rep in reduce.keys(rank, host):
            width = rep.block.width
            n = BATCH_SIZES[rank] * FP32.row_bytes(width)
            rows = received[start : start + n].reshape(BATCH_SIZES[rank], FP32.row_bytes(width))
            got = FP32.decode(rows, width)
            start += n
            expected = sum(
                _partial(owner, rank, r)
                for owner in reduce.owners_on(host)
                for r in routes.requests(rank, owner)
                if (r.slot, r.block.col_shard) == key
            )
            assert torch.equal(got, expected), (rank, host, key)
    assert start == received.numel()  # one [B, width] block per key and host, nothing else
    # Backward: one gradient slice per key and host; every row-shard owner gets it.
    chunks, sizes = [], []
    for host in range(2):
        per_host = [
            FP32.encode(_grad(rank, host, key, r.block.width)).payload.reshape(-1)
            for key, r in reduce.keys(rank, host)
        ]
        chunks += per_host
        sizes.append(sum(c.numel() for c in per_host))
    pieces = [[None] * len(routes.requests(q, rank)) for q in range(world)]
    out = reduce.backward(torch.cat(chunks), sizes, pieces, BATCH_SIZES, FP32)
    for q in range(world):
        requests = routes.requests(q, rank)
        assert len(out[q]) == len(requests)
        for r, got in zip(requests, out[q], strict=True):
            key = (r.slot, r.block.col_shard)
            assert torch.equal(got, _grad(q, rank // 2, key, r.block.width)), (rank, q, key)


# ----------------------------------------------------------------- through the sharded module

SGD = SparseOptimizer(kind=OptimizerKind.SGD, lr=0.25)
MODULE_BATCH = [3, 2, 0, 4]


def _scenario(hierarchical: bool) -> Scenario:
    """a: rows split over host 0 (k=2); g: grid, row shard 0 on ranks 0 / 2, row shard 1 on
    ranks 1 / 3, so each host holds both row shards of one column shard."""
    tables = [
        EmbeddingBagConfig(name="t_a", num_embeddings=10, embedding_dim=4, feature_names=["a"]),
        EmbeddingBagConfig(name="t_g", num_embeddings=13, embedding_dim=8, feature_names=["g"]),
    ]
    plan = Plan(
        world_size=WORLD,
        ranks_per_host=LOCAL,
        clusters=(ClusterPlan(name="rb", type="rb", hierarchical=hierarchical),),
        tables=(
            layouts.table_row_wise("a", "rb", 0, LOCAL),
            layouts.grid("g", "rb", [[0, 2], [1, 3]]),
        ),
    )
    return Scenario(tables=tables, plan=plan)


def _saved_cross_host_bytes() -> int:
    """Bytes a hierarchical step saves across hosts, summed over ranks.

    Per requester and direction (rows forward, gradients backward), fp32 (4 bytes):
    a's two partials from host 0 cross once instead of twice for requesters on host 1
    (4 wide); g's two row shards on the other host cross once (4 wide) for everyone.
    Headers and IDs cross the same bytes either way.
    """
    host1 = sum(MODULE_BATCH[LOCAL:])
    return 2 * 4 * 4 * (host1 + sum(MODULE_BATCH))


def _through_module(rank: int, world: int) -> None:
    gen = torch.Generator().manual_seed(0)
    ebc = EmbeddingBagCollection(tables=_scenario(False).tables)
    with torch.no_grad():
        for bag in ebc.embedding_bags.values():
            bag.weight.copy_(torch.randint(-8, 9, bag.weight.shape, generator=gen) / 4)
    batches = random_batches(_scenario(False), MODULE_BATCH, seed=3)
    upstream = torch.randint(-3, 4, (sum(MODULE_BATCH), 12), generator=gen).float()
    mine = slice(sum(MODULE_BATCH[:rank]), sum(MODULE_BATCH[: rank + 1]))
    modules = {
        # Plain engines: the counter's window must hold the backward, which an overlapped
        # engine leaves running past the step.
        h: ShardedEmbeddingBagCollection.from_ebc(
            ebc, _scenario(h).plan, sparse_optimizer=SGD, config=EngineConfig(overlap=False)
        )
        for h in (False, True)
    }
    expected = ebc(concat_batches(batches))
    (expected.values() * upstream).sum().backward()
    ReferenceOptimizer(ebc, SGD).step()
    inter = {}
    for hierarchical, module in modules.items():
        counter = CommCounter(rank=rank, ranks_per_host=LOCAL)
        with counting_collectives(counter):
            out = module(batches[rank])
            (out.values() * upstream[mine]).sum().backward()
        inter[hierarchical] = counter.reset().inter_host_bytes
        assert torch.equal(out.values().detach(), expected.values()[mine].detach()), hierarchical
        for shard in module.local_shards():
            full = ebc.embedding_bags[f"t_{shard.table}"].weight.detach()
            assert torch.equal(shard.weight, full[shard.rows, shard.col_start : shard.col_end])
    totals = torch.tensor([inter[False], inter[True]])
    dist.all_reduce(totals)
    assert int(totals[0] - totals[1]) == _saved_cross_host_bytes() > 0


def _all(rank: int, world: int) -> None:
    _drive_host_reduce(rank, world)
    _through_module(rank, world)


@pytest.mark.multiprocess
def test_host_reduce_sums_partials_inside_hosts_and_routes_gradients_to_every_owner() -> None:
    """One set of ranks for both checks: the direct HostReduce and the sharded module."""
    run_gloo_ranks(_all, WORLD)
