"""Per-table, per-rank cost terms: the vectorised core of the cost model.

One table's layout and cluster settings become a ``[NUM_TERMS, world]`` array: lookup
and codec seconds, bytes sent and received on each link class (kept apart for flat
and hierarchical exchanges, which overlap differently;
:mod:`~lightning_embark.planner._links` prices them in seconds) and memory. Terms add up
over tables, so the planner can update a plan's cost table by table instead of
re-evaluating it. Volumes follow the engine (``lightning_embark.engine._analytic_bytes``):
RB sends ``B`` lengths and its IDs to every block and gets ``B`` pooled rows back per
block; UB sends its unique IDs split over row shards and gets one row per unique ID;
backward mirrors the rows with the backward codec; IDs are int32.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from lightning_embark.plan import ClusterPlan, ClusterType, Compression, hbm_block_bytes, is_cached
from lightning_embark.planner._hardware import Calibration
from lightning_embark.planner._uvm import miss_seconds
from lightning_embark.wire import codec_for

#: Rows of a term array: compute seconds, bytes sent / received per link class for
#: flat exchanges (both links at once) and for hierarchical ones (stage after stage),
#: and stored bytes.
(
    LOOKUP,
    CODEC,
    FLAT_INTRA_SENT,
    FLAT_INTRA_RECEIVED,
    FLAT_INTER_SENT,
    FLAT_INTER_RECEIVED,
    HIER_INTRA_SENT,
    HIER_INTRA_RECEIVED,
    HIER_INTER_SENT,
    HIER_INTER_RECEIVED,
    MEM,
) = range(11)
NUM_TERMS = 11
ID_BYTES = 4


@dataclass(frozen=True, kw_only=True)
class TableLoad:
    """What one table costs whatever its layout: ``B``, ``h``, unique IDs, width, rows,
    and the IDs' Zipf exponent (None: uniform), which prices a UVM cache's misses."""

    batch: int
    hotness: float
    unique: float
    dim: int
    rows: int
    alpha: float | None = None


@functools.lru_cache(maxsize=4096)
def row_bytes(compression: Compression, width: int, *, backward: bool) -> int:
    """Wire bytes of one row of ``width`` values (cached: the planner asks often)."""
    return codec_for(compression, backward=backward).row_bytes(width)


def route_seconds(calib: Calibration, load: TableLoad, *, unique_based: bool) -> float:
    """Seconds one requester spends routing a row-split table's IDs to its shards (UB
    routes its unique IDs, RB every ID)."""
    return (load.unique if unique_based else load.batch * load.hotness) * calib.route_id_seconds


def piece_and_codec(calib: Calibration, compression: Compression) -> tuple[float, float]:
    """Fixed seconds per exchanged piece, and seconds per fp32 byte of one codec pass
    (encode or decode; 0 when lossless), for a cluster of ``compression``."""
    if compression is Compression.FP32:
        return calib.piece_seconds, 0.0
    if compression in (Compression.FP16, Compression.BF16):
        return calib.piece_seconds + calib.cast_piece_seconds, 1.0 / (
            calib.cast_codec_bandwidth or calib.codec_bandwidth
        )
    bandwidth = (
        calib.int8_codec_bandwidth if compression is Compression.INT8 else None
    ) or calib.codec_bandwidth
    return calib.piece_seconds + calib.codec_piece_seconds, 1.0 / bandwidth


class TermModel:
    """Computes :data:`NUM_TERMS` x world arrays for one table at a time."""

    def __init__(self, calib: Calibration, *, num_hosts: int, ranks_per_host: int) -> None:
        self.calib, self.hosts, self.local = calib, num_hosts, ranks_per_host
        self.world = num_hosts * ranks_per_host
        self.ranks = np.arange(self.world)
        self.host = self.ranks // ranks_per_host
        self._row_bytes: dict[tuple, int] = {}

    def _rb(self, compression: Compression, width: int, backward: bool) -> int:
        key = (compression, width, backward)
        if key not in self._row_bytes:
            self._row_bytes[key] = row_bytes(compression, width, backward=backward)
        return self._row_bytes[key]

    def element_bytes(self, rows: float, width: int) -> float:
        """Stored bytes of ``rows`` rows of ``width`` (weights plus optimizer state)."""
        c = self.calib
        return rows * (
            width * (c.weight_bytes + c.optimizer_bytes_per_element) + c.optimizer_bytes_per_row
        )

    def handling(self, bags: float, ids: float) -> float:
        """Forward plus backward seconds of pooling ``bags`` bags of ``ids`` IDs beyond the
        bytes read (per-bag and per-ID work, calibrated; 0 in the datasheet presets)."""
        return bags * self.calib.lookup_bag_seconds + ids * self.calib.lookup_id_seconds

    def unique_pooling(self, load: TableLoad) -> float:
        """Forward plus backward seconds of a UB requester's own work on one table:
        de-duplicate its IDs, pool every bag from the unique rows, sum the gradient per
        unique row (calibrated; without a calibration, a lookup of the same IDs)."""
        c, ids = self.calib, load.batch * load.hotness
        if c.unique_pool_bandwidth is None:
            return ids * load.dim * 4 * 2 / c.lookup_bandwidth + self.handling(load.batch, ids)
        return (
            load.batch * c.unique_pool_bag_seconds
            + ids * c.unique_pool_id_seconds
            + load.unique * c.unique_pool_row_seconds
            + ids * load.dim * 4 / c.unique_pool_bandwidth
        )

    def updated(
        self, unique_per_requester: float, num_requesters: int, block_rows: float
    ) -> float:
        """Backward seconds of updating the distinct rows of one block: every requester's
        distinct IDs in it, as if no two requesters shared one (an upper bound), at most
        the block's rows."""
        return (
            min(block_rows, num_requesters * unique_per_requester) * self.calib.update_row_seconds
        )

    def dp(self, load: TableLoad) -> np.ndarray:
        """A replica on every rank: local lookup, the update of the rows any rank touched
        (after the all-reduce) and memory; the all-reduce is per cluster."""
        out = np.zeros((NUM_TERMS, self.world))
        c = self.calib
        out[LOOKUP] = (
            load.batch
            * load.hotness
            * load.dim
            * 4
            * (1 + c.backward_lookup_factor)
            / c.lookup_bandwidth
            + self.handling(load.batch, load.batch * load.hotness)
            + self.updated(load.unique, self.world, load.rows)
        )
        out[MEM] = self.element_bytes(load.rows, load.dim)
        return out

    def sharded(
        self,
        load: TableLoad,
        cluster: ClusterPlan,
        k: int,
        c: int,
        groups: tuple[tuple[int, ...], ...],
        *,
        cache_load_factor: float | None = None,
    ) -> np.ndarray:
        """An RB or UB table with ``k`` row and ``c`` column shards per replica group.

        Per requester ``q`` and block (one of the ``k * c`` of ``q``'s replica group),
        with ``B`` the batch, ``h`` the hotness, ``U`` the unique IDs and ``w = d / c``:

        ================  ==============================  ==========================
        quantity          RB                              UB
        ================  ==============================  ==========================
        ID bytes          ``4 (B + B h / k)``             ``4 U / k``
        rows answered     ``B``                           ``U / k``
        rows read         ``B h / k``                     ``U / k``
        ================  ==============================  ==========================

        A requester sends an owner ``to_owner = IDs + rows * grad_row_bytes(w)`` (IDs
        forward, gradients backward) and receives ``to_requester = rows *
        row_bytes(w)``. Owners pay per requester the lookup (bytes read over
        ``lookup_bandwidth`` plus per-bag and per-ID work), the codec passes and the
        piece cost; requesters pay the codec passes and piece cost per block, and route
        IDs when ``k > 1``. Traffic counts on the link between the two ranks: inside the
        host or across hosts. A block cached in UVM (``cache_load_factor`` below 1) stores
        its cache in HBM and pays its misses over the host link
        (:func:`lightning_embark.planner._uvm.miss_seconds`). A hierarchical exchange
        sends across hosts only between
        same-local-rank peers, so a share ``(L - 1) / L`` of the cross-host traffic is
        forwarded inside the host first; RB's rows are then reduced inside the owners'
        host (one row per sample, column shard and host instead of one per block).
        """
        cal, world, local = self.calib, self.world, self.local
        ub = cluster.type is ClusterType.UB
        width = load.dim // c
        unique_per_shard = load.unique / k
        id_bytes = (
            ID_BYTES * unique_per_shard
            if ub
            else ID_BYTES * (load.batch + load.batch * load.hotness / k)
        )
        rows_answered = unique_per_shard if ub else float(load.batch)
        rows_read = unique_per_shard if ub else load.batch * load.hotness / k
        answer_bytes = rows_answered * self._rb(cluster.forward_compression, width, False)
        grad_bytes = rows_answered * self._rb(cluster.backward_compression, width, True)
        to_owner, to_requester = id_bytes + grad_bytes, answer_bytes
        piece_seconds, codec_seconds_per_byte = piece_and_codec(cal, cluster.forward_compression)
        codec_seconds = (
            2 * rows_answered * width * 4 * codec_seconds_per_byte
        )  # encode and decode, per piece
        hierarchical = cluster.hierarchical and self.hosts > 1
        intra_sent = HIER_INTRA_SENT if hierarchical else FLAT_INTRA_SENT
        out = np.zeros((NUM_TERMS, world))
        replicas = len(groups)
        shard_rows = -(-load.rows // k)
        replica_of = self.ranks * replicas // world
        blocks = k * c
        for g, owners in enumerate(groups):
            owner_ranks = np.asarray(owners)
            first = int(np.searchsorted(replica_of, g))
            last = int(np.searchsorted(replica_of, g, side="right"))
            num_requesters = last - first  # requesters of group g: ranks [first, last)
            blocks_on_rank = np.bincount(owner_ranks, minlength=world).astype(float)
            blocks_on_host = np.bincount(owner_ranks // local, minlength=self.hosts).astype(float)
            requesters_on_host = np.bincount(
                self.ranks[first:last] // local, minlength=self.hosts
            ).astype(float)
            requesters = slice(first, last)
            # requester side: blocks on its own host (other ranks), blocks on other hosts
            peers_in_host = blocks_on_host[self.host[requesters]] - blocks_on_rank[requesters]
            blocks_off_host = blocks - blocks_on_host[self.host[requesters]]
            # owner side: (block, requester) pairs inside its host and across hosts
            is_requester = (self.ranks >= first) & (self.ranks < last)
            requests_in_host = blocks_on_rank * (requesters_on_host[self.host] - is_requester)
            requests_off_host = blocks_on_rank * (num_requesters - requesters_on_host[self.host])
            lookup = (
                rows_read * width * 4 * (1 + cal.backward_lookup_factor) / cal.lookup_bandwidth
            )
            out[LOOKUP] += (
                blocks_on_rank
                * num_requesters
                * (lookup + self.handling(rows_answered, rows_read))
            )
            out[LOOKUP] += blocks_on_rank * self.updated(
                unique_per_shard, num_requesters, shard_rows
            )
            out[CODEC] += codec_seconds * (blocks_on_rank * num_requesters)
            out[CODEC, requesters] += codec_seconds * blocks
            out[LOOKUP] += piece_seconds * (blocks_on_rank * num_requesters)
            out[LOOKUP, requesters] += piece_seconds * blocks
            if is_cached(cache_load_factor):
                assert cache_load_factor is not None
                out[MEM] += blocks_on_rank * hbm_block_bytes(
                    shard_rows,
                    width,
                    cache_load_factor,
                    element_bytes=cal.weight_bytes,
                    row_bytes=cal.optimizer_bytes_per_row,
                )
                out[LOOKUP] += blocks_on_rank * miss_seconds(
                    cal,
                    cache_load_factor=cache_load_factor,
                    block_rows=shard_rows,
                    width=width,
                    accesses=num_requesters * rows_read,
                    distinct=min(shard_rows, num_requesters * unique_per_shard),
                    alpha=load.alpha,
                )
            else:
                out[MEM] += blocks_on_rank * self.element_bytes(shard_rows, width)
            out[intra_sent, requesters] += to_owner * peers_in_host
            out[intra_sent + 1, requesters] += to_requester * peers_in_host
            out[intra_sent] += to_requester * requests_in_host
            out[intra_sent + 1] += to_owner * requests_in_host
            if not hierarchical:
                out[FLAT_INTER_SENT, requesters] += to_owner * blocks_off_host
                out[FLAT_INTER_RECEIVED, requesters] += to_requester * blocks_off_host
                out[FLAT_INTER_SENT] += to_requester * requests_off_host
                out[FLAT_INTER_RECEIVED] += to_owner * requests_off_host
                continue
            forwarded = (
                local - 1
            ) / local  # share of cross-host traffic first moved inside the host
            if ub:
                out[HIER_INTER_SENT, requesters] += to_owner * blocks_off_host
                out[HIER_INTER_RECEIVED, requesters] += to_requester * blocks_off_host
                out[HIER_INTER_SENT] += to_requester * requests_off_host
                out[HIER_INTER_RECEIVED] += to_owner * requests_off_host
                moved_by_requester = (to_owner + to_requester) * blocks_off_host * forwarded
                moved_by_owner = (to_owner + to_requester) * requests_off_host * forwarded
            else:  # HostReduce: one pooled row per (sample, column shard) and host crosses hosts
                rows_per_host = np.minimum(c, blocks_on_host)
                reduction = np.divide(
                    rows_per_host,
                    blocks_on_host,
                    out=np.ones_like(blocks_on_host),
                    where=blocks_on_host > 0,
                )
                reduced_off_host = rows_per_host.sum() - rows_per_host[self.host[requesters]]
                out[HIER_INTER_SENT, requesters] += (
                    id_bytes * blocks_off_host + grad_bytes * reduced_off_host
                )
                out[HIER_INTER_RECEIVED, requesters] += answer_bytes * reduced_off_host
                out[HIER_INTER_SENT] += answer_bytes * requests_off_host * reduction[self.host]
                out[HIER_INTER_RECEIVED] += (
                    id_bytes + grad_bytes * reduction[self.host]
                ) * requests_off_host
                moved_by_requester = id_bytes * blocks_off_host * forwarded
                moved_by_owner = (
                    answer_bytes + grad_bytes
                ) * requests_off_host + id_bytes * requests_off_host * forwarded
            out[HIER_INTRA_SENT, requesters] += moved_by_requester
            out[HIER_INTRA_RECEIVED, requesters] += moved_by_requester
            out[HIER_INTRA_SENT] += moved_by_owner
            out[HIER_INTRA_RECEIVED] += moved_by_owner
        if k > 1:  # every requester routes its IDs (UB: its unique IDs) to the row shards
            out[LOOKUP] += route_seconds(cal, load, unique_based=ub)
        if ub:
            out[LOOKUP] += self.unique_pooling(load)
        if replicas > 1:
            self._replica_sync(out, load, k, c, groups, hierarchical)
        return out

    def _replica_sync(
        self, out: np.ndarray, load: TableLoad, k: int, c: int, groups, hier: bool
    ) -> None:
        """Replicated blocks exchange ``[id | fp32 row]`` per row their group updated."""
        w = load.dim // c
        requesters = self.world / len(groups)
        rows = min(load.rows / k, requesters * load.unique / k)
        size = rows * (ID_BYTES + 4 * w)
        for g, owners in enumerate(groups):
            for other, peers in enumerate(groups):
                if other == g:
                    continue
                for src, dst in zip(owners, peers, strict=False):
                    if src == dst:
                        continue
                    same = self.host[src] == self.host[dst]
                    if same:
                        base = HIER_INTRA_SENT if hier else FLAT_INTRA_SENT
                    else:
                        base = HIER_INTER_SENT if hier else FLAT_INTER_SENT
                    out[base, src] += size
                    out[base + 1, dst] += size

    def latency(self, cluster: ClusterPlan, replicated: bool) -> float:
        """Seconds of per-message latency of one step of an exchanged cluster.

        A flat step is 4 all-to-alls over the world (ID counts, IDs, rows, gradients).
        A hierarchical step (as the byte counter counts its calls) is 4 across hosts
        plus 8 inside the host for UB (every exchange swaps counts and data there) or 6
        for RB (whose pooled rows are reduced inside the host instead); fewer peers per
        call, more calls.
        """
        cal, local, world = self.calib, self.local, self.world
        flat_call = (local - 1) * cal.intra_latency + (world - local) * cal.inter_latency
        sync = flat_call if replicated else 0.0
        if cluster.hierarchical and self.hosts > 1:
            intra_calls = 8 if cluster.type is ClusterType.UB else 6
            intra_call = (local - 1) * cal.intra_latency
            inter_call = (self.hosts - 1) * cal.inter_latency
            return intra_calls * intra_call + 4 * inter_call + sync + cal.kernel_overhead
        return 4 * flat_call + sync + cal.kernel_overhead

    def allreduce(self, num_bytes: float) -> float:
        """Seconds of a ring all-reduce of ``num_bytes`` over the world."""
        cal, world = self.calib, self.world
        if world == 1 or num_bytes == 0:
            return 0.0
        across = self.hosts > 1
        bandwidth = (
            (cal.allreduce_bandwidth or cal.inter_bandwidth) if across else cal.intra_bandwidth
        )
        return 2 * (world - 1) / world * num_bytes / bandwidth + self.allreduce_latency()

    def allreduce_latency(self) -> float:
        """Fixed seconds of one all-reduce over the world, whatever its size."""
        cal, world = self.calib, self.world
        if world == 1:
            return 0.0
        if cal.allreduce_latency is not None:
            return cal.allreduce_latency + cal.kernel_overhead
        alpha = cal.inter_latency if self.hosts > 1 else cal.intra_latency
        return 2 * (world - 1) * alpha + cal.kernel_overhead
