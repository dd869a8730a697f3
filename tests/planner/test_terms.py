"""The cost model's per-table terms, by hand: bytes per link class, lookup, codec, memory,
latency calls and all-reduce (link seconds: ``test_links.py``).

The calibration uses round constants (1 GB/s inside a host, 100 MB/s across, 1 GB/s
lookups, no latencies unless a test sets them), so byte terms are exact integers (or
halves) in float64 and compared with ``==``. Seconds are a few products and quotients
of exact numbers, each side rounded at most ~5 times by 2**-53: they are compared with
``rel=1e-12``, far above that rounding and far below any wrong factor.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from lightning_embark.engine._analytic_bytes import analytic_bytes
from lightning_embark.plan import layouts
from lightning_embark.plan._types import ClusterPlan, ClusterType, Plan, TableLayout
from lightning_embark.planner._hardware import Calibration
from lightning_embark.planner._terms import (
    CODEC,
    FLAT_INTER_RECEIVED,
    FLAT_INTER_SENT,
    FLAT_INTRA_RECEIVED,
    FLAT_INTRA_SENT,
    HIER_INTER_RECEIVED,
    HIER_INTER_SENT,
    HIER_INTRA_RECEIVED,
    HIER_INTRA_SENT,
    LOOKUP,
    MEM,
    NUM_TERMS,
    TableLoad,
    TermModel,
)
from lightning_embark.wire import row_bytes

REL = 1e-12
CALIB = Calibration(intra_bandwidth=1e9, inter_bandwidth=1e8, lookup_bandwidth=1e9)
B, H, U, D, ROWS = 8, 3, 10, 16, 100
LOAD = TableLoad(batch=B, hotness=H, unique=U, dim=D, rows=ROWS)
FP32_ROW = row_bytes("fp32", D, backward=False)  # 64
FLAT = (FLAT_INTRA_SENT, FLAT_INTRA_RECEIVED, FLAT_INTER_SENT, FLAT_INTER_RECEIVED)
HIER = (HIER_INTRA_SENT, HIER_INTRA_RECEIVED, HIER_INTER_SENT, HIER_INTER_RECEIVED)


def _rb(**fields) -> ClusterPlan:
    return ClusterPlan(name="c", type=ClusterType.RB, **fields)


def _ub(**fields) -> ClusterPlan:
    return ClusterPlan(name="c", type=ClusterType.UB, **fields)


def _terms(hosts: int, local: int, cluster: ClusterPlan, layout: TableLayout, load=LOAD):
    model = TermModel(CALIB, num_hosts=hosts, ranks_per_host=local)
    out = model.sharded(load, cluster, layout.num_row_shards, layout.num_col_shards, layout.ranks)
    assert out.shape == (NUM_TERMS, hosts * local)
    return out


# ----------------------------------------------------------------- sharded: one host


def test_table_wise_rb_owner_and_requester_bytes() -> None:
    """Rank 1 owns the table; rank 0 only requests. Per requester and block:
    ID bytes 4 (B + B h) = 128, B = 8 rows answered of 64 bytes, gradients the same."""
    out = _terms(1, 2, _rb(), layouts.table_wise("t", "c", 1))
    ids = 4 * (B + B * H)
    assert ids == 128 and FP32_ROW == 64
    to_owner, to_requester = ids + B * FP32_ROW, B * FP32_ROW  # 640, 512
    # the owner's own requests stay on the rank
    assert out[FLAT_INTRA_SENT].tolist() == [to_owner, to_requester]
    assert out[FLAT_INTRA_RECEIVED].tolist() == [to_requester, to_owner]
    assert not out[[FLAT_INTER_SENT, FLAT_INTER_RECEIVED, *HIER]].any()
    # the owner reads B h rows of 64 bytes per requester, forward plus twice backward
    assert out[LOOKUP, 0] == 0
    assert out[LOOKUP, 1] == pytest.approx(2 * B * H * D * 4 * 3 / 1e9, rel=REL)
    assert not out[CODEC].any()  # fp32: no codec passes
    # weights (4 bytes) plus row-wise state (4 bytes per row)
    assert out[MEM].tolist() == [0, ROWS * (D * 4 + 4)]


def test_rb_row_shards_split_the_ids_but_not_the_lengths() -> None:
    out = _terms(1, 2, _rb(), layouts.row_wise("t", "c", [0, 1]))
    ids = 4 * (B + B * H / 2)  # every block gets B lengths and its shard's IDs: 80
    per_rank = (ids + B * FP32_ROW) + B * FP32_ROW  # to the peer's block, and its answer
    assert out[FLAT_INTRA_SENT].tolist() == [per_rank] * 2 == [1104] * 2
    assert out[FLAT_INTRA_RECEIVED].tolist() == [per_rank] * 2
    # each block reads B h / 2 rows for each of 2 requesters
    assert out[LOOKUP].tolist() == pytest.approx([2 * (B * H / 2) * D * 4 * 3 / 1e9] * 2, rel=REL)
    assert out[MEM].tolist() == [50 * (D * 4 + 4)] * 2


def test_ub_row_shards_carry_unique_ids_and_rows_per_shard_with_each_codec() -> None:
    calib = dataclasses.replace(CALIB, codec_bandwidth=1e9)
    model = TermModel(calib, num_hosts=1, ranks_per_host=2)
    cluster = _ub(forward_compression="bf16", backward_compression="fp8")
    out = model.sharded(LOAD, cluster, 2, 1, ((0, 1),))
    rows = U / 2  # unique IDs per row shard
    ids = 4 * U / 2
    answer = rows * row_bytes("bf16", D, backward=False)  # 5 * 32
    grads = rows * row_bytes("fp8", D, backward=True)  # 5 * (16 + 4): e5m2 plus a scale
    assert (ids, answer, grads) == (20, 160, 100)
    assert out[FLAT_INTRA_SENT].tolist() == [ids + grads + answer] * 2 == [280] * 2
    assert out[FLAT_INTRA_RECEIVED].tolist() == [280] * 2
    # codec: encode + decode of the answered rows' fp32 bytes, for the 2 pieces a rank
    # serves and the 2 it receives
    piece = 2 * rows * D * 4 / 1e9
    assert out[CODEC].tolist() == pytest.approx([4 * piece] * 2, rel=REL)
    # lookups of U / 2 rows per requester, plus the requester's own pooling of its B h IDs
    # (no calibration of it: priced as a lookup of the same IDs, forward and backward)
    lookup = 2 * rows * D * 4 * 3 / 1e9 + B * H * D * 4 * 2 / 1e9
    assert out[LOOKUP].tolist() == pytest.approx([lookup] * 2, rel=REL)


def test_replicas_add_a_sync_of_id_and_fp32_row_per_updated_row() -> None:
    """Two replicas, one per rank: every requester reads its own copy (no lookup
    traffic); each copy sends its peer one [4-byte id | 64-byte row] per row its group
    updated, at most the requesters' unique IDs (12 here)."""
    load = dataclasses.replace(LOAD, unique=12)
    out = _terms(1, 2, _rb(), layouts.replicated("t", "c", [[0], [1]]), load)
    sync = 12 * (4 + 4 * D)
    assert out[FLAT_INTRA_SENT].tolist() == [sync, sync] == [816, 816]
    assert out[FLAT_INTRA_RECEIVED].tolist() == [sync, sync]
    hier = _terms(1, 2, _rb(hierarchical=True), layouts.replicated("t", "c", [[0], [1]]), load)
    np.testing.assert_array_equal(hier, out)  # one host: a hierarchical exchange is flat


# ----------------------------------------------------------------- sharded: two hosts


def test_flat_cross_host_traffic_counts_on_the_inter_link() -> None:
    out = _terms(2, 2, _rb(), layouts.table_row_wise("t", "c", 0, 2))
    ids = 4 * (B + B * H / 2)
    to_owner, to_requester = ids + B * FP32_ROW, B * FP32_ROW  # 592, 512
    # host-1 requesters ask both blocks on host 0; each owner answers both of them
    assert out[FLAT_INTER_SENT].tolist() == [2 * to_requester] * 2 + [2 * to_owner] * 2
    assert out[FLAT_INTER_RECEIVED].tolist() == [2 * to_owner] * 2 + [2 * to_requester] * 2
    assert out[FLAT_INTRA_SENT].tolist() == [to_owner + to_requester] * 2 + [0, 0]
    assert not out[list(HIER)].any()


def test_hierarchical_rb_sends_one_reduced_row_per_key_across_hosts() -> None:
    """Table split over host 0's 2 ranks, requesters on both hosts.

    Across hosts a host-1 requester sends its IDs to both blocks (2 * 80) and one
    gradient per key (512), and receives one reduced answer (512); each owner sends half
    of the reduced answers of the 2 host-1 requesters and receives their IDs and half
    their gradients. Inside its host a requester forwards the (L-1)/L = 1/2 share of
    its cross-host IDs (80)."""
    flat = _terms(2, 2, _rb(), layouts.table_row_wise("t", "c", 0, 2))
    out = _terms(2, 2, _rb(hierarchical=True), layouts.table_row_wise("t", "c", 0, 2))
    ids, answer, grad = 80, B * FP32_ROW, B * FP32_ROW
    assert not out[list(FLAT)].any()
    assert out[HIER_INTER_SENT].tolist() == [answer] * 2 + [2 * ids + grad] * 2
    assert out[HIER_INTER_RECEIVED].tolist() == [2 * ids + grad] * 2 + [answer] * 2
    assert out[HIER_INTRA_SENT, 2:].tolist() == [2 * ids / 2] * 2
    assert out[HIER_INTRA_RECEIVED, 2:].tolist() == [2 * ids / 2] * 2
    # owners also forward partials and gradients inside host 0, beyond their in-host traffic
    in_host = (ids + grad) + answer
    assert (out[HIER_INTRA_SENT, :2] > in_host).all()
    # Cross-host bytes drop by one answer and one gradient per host-1 requester (L = 2
    # partials become one); IDs cross as before.
    saved = flat[FLAT_INTER_SENT].sum() - out[HIER_INTER_SENT].sum()
    assert saved == 2 * (answer + grad) == 2048
    # compute and memory do not depend on the exchange
    np.testing.assert_array_equal(out[[LOOKUP, CODEC, MEM]], flat[[LOOKUP, CODEC, MEM]])


def test_hierarchical_ub_moves_the_same_bytes_across_hosts() -> None:
    layout = layouts.row_wise("t", "c", range(4))
    flat = _terms(2, 2, _ub(), layout)
    hier = _terms(2, 2, _ub(hierarchical=True), layout)
    np.testing.assert_array_equal(hier[HIER_INTER_SENT], flat[FLAT_INTER_SENT])
    np.testing.assert_array_equal(hier[HIER_INTER_RECEIVED], flat[FLAT_INTER_RECEIVED])
    np.testing.assert_array_equal(hier[HIER_INTRA_SENT] > flat[FLAT_INTRA_SENT], [True] * 4)


# ----------------------------------------------------------------- against the engine


def _header_bytes(plan: Plan, config: EmbeddingBagConfig) -> list[tuple[int, int]]:
    """The forward header the model leaves out: 8 * (1 + requests) to every peer, per rank
    (intra, inter)."""
    from lightning_embark.engine._tables import build_routes, tables_of

    tables, features, sub = tables_of([config], plan)
    ((routes, _),) = build_routes(tables, features, sub)
    out = []
    for q in range(plan.world_size):
        sent = [
            (p, 8 * (1 + len(routes.requests(q, p)))) for p in range(plan.world_size) if p != q
        ]
        intra = sum(n for p, n in sent if p // plan.ranks_per_host == q // plan.ranks_per_host)
        out.append((intra, sum(n for _, n in sent) - intra))
    return out


@pytest.mark.parametrize("kind", ["rb", "ub"])
@pytest.mark.parametrize(
    "layout",
    [
        layouts.table_wise("f", "c", 1),
        layouts.table_row_wise("f", "c", 0, 2),
        layouts.row_wise("f", "c", range(4)),
        layouts.column_wise("f", "c", range(4)),
        layouts.grid("f", "c", [[0, 3], [1, 2]]),
    ],
    ids=["tw", "twrw", "rw", "cw", "grid"],
)
def test_flat_volumes_equal_the_engines_bytes_but_the_headers(
    kind: str, layout: TableLayout
) -> None:
    """Every rank asks IDs 0..23 once each (B = 8 bags of 3): U = 24, split evenly over
    2 or 4 hash shards, so the model's means are the engine's counts."""
    config = EmbeddingBagConfig(
        name="t_f", num_embeddings=ROWS, embedding_dim=D, feature_names=["f"]
    )
    cluster = ClusterPlan(name="c", type=kind)
    plan = Plan(world_size=4, ranks_per_host=2, clusters=(cluster,), tables=(layout,))
    batch = KeyedJaggedTensor(
        keys=["f"], values=torch.arange(B * H), lengths=torch.full((B,), H), stride=B
    )
    engine = analytic_bytes(plan, [config], [batch] * 4)
    load = dataclasses.replace(LOAD, unique=B * H)
    out = _terms(2, 2, cluster, layout, load)
    for rank, (step, (intra, inter)) in enumerate(
        zip(engine, _header_bytes(plan, config), strict=True)
    ):
        sent = step.forward + step.backward
        assert (sent.intra - intra, sent.inter - inter) == (
            out[FLAT_INTRA_SENT, rank],
            out[FLAT_INTER_SENT, rank],
        ), rank


# ----------------------------------------------------------------- dp, latency, all-reduce


def test_dp_terms_are_a_local_lookup_and_a_whole_replica() -> None:
    out = TermModel(CALIB, num_hosts=2, ranks_per_host=2).dp(LOAD)
    assert out[LOOKUP].tolist() == pytest.approx([B * H * D * 4 * 3 / 1e9] * 4, rel=REL)
    assert out[MEM].tolist() == [ROWS * (D * 4 + 4)] * 4
    assert not out[[CODEC, *FLAT, *HIER]].any()


LATENCY = dataclasses.replace(CALIB, intra_latency=1.0, inter_latency=100.0)


@pytest.mark.parametrize(
    ("cluster", "replicated", "seconds"),
    [
        # flat on 2 x 2: a call waits for 1 peer inside the host and 2 across: 1 + 200
        (_rb(), False, 4 * 201),
        (_ub(), False, 4 * 201),
        (_rb(), True, 5 * 201),  # + one replica sync call
        # hierarchical: 4 calls across hosts (1 peer each), 6 (RB) / 8 (UB) inside (1 peer)
        (_rb(hierarchical=True), False, 4 * 100 + 6 * 1),
        (_ub(hierarchical=True), False, 4 * 100 + 8 * 1),
        (_rb(hierarchical=True), True, 4 * 100 + 6 * 1 + 201),  # the sync call is flat
    ],
    ids=["rb", "ub", "rb-sync", "rb-hier", "ub-hier", "rb-hier-sync"],
)
def test_latency_counts_calls_and_peers(
    cluster: ClusterPlan, replicated: bool, seconds: float
) -> None:
    model = TermModel(LATENCY, num_hosts=2, ranks_per_host=2)
    assert model.latency(cluster, replicated) == seconds
    overhead = TermModel(
        dataclasses.replace(LATENCY, kernel_overhead=0.5), num_hosts=2, ranks_per_host=2
    )
    assert overhead.latency(cluster, replicated) == seconds + 0.5  # once per cluster


def test_a_single_host_hierarchical_step_is_a_flat_one() -> None:
    model = TermModel(LATENCY, num_hosts=1, ranks_per_host=2)
    assert model.latency(_ub(hierarchical=True), False) == model.latency(_ub(), False) == 4 * 1


def test_allreduce_is_a_ring_over_the_slower_link() -> None:
    calib = dataclasses.replace(CALIB, intra_latency=0.25, inter_latency=0.5)
    one_host = TermModel(calib, num_hosts=1, ranks_per_host=4)
    # 2 (W-1)/W of the buffer over the intra link, plus 2 (W-1) intra latencies
    assert one_host.allreduce(4e9) == pytest.approx(2 * 3 / 4 * 4 + 6 * 0.25, rel=REL)
    two_hosts = TermModel(calib, num_hosts=2, ranks_per_host=2)
    assert two_hosts.allreduce(4e8) == pytest.approx(2 * 3 / 4 * 4 + 6 * 0.5, rel=REL)
    measured = TermModel(
        dataclasses.replace(
            calib, allreduce_bandwidth=2e8, allreduce_latency=0.25, kernel_overhead=0.125
        ),
        num_hosts=2,
        ranks_per_host=2,
    )
    assert measured.allreduce(4e8) == pytest.approx(2 * 3 / 4 * 2 + 0.25 + 0.125, rel=REL)
    assert measured.allreduce(0) == 0.0
    assert TermModel(calib, num_hosts=1, ranks_per_host=1).allreduce(4e9) == 0.0
