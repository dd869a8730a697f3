"""Per-table, per-rank cost terms: the vectorised core of the cost model.

One table's layout and cluster settings become a ``[NUM_TERMS, world]`` array: lookup
and codec seconds, bytes sent and received on each link class (kept apart for flat
and hierarchical exchanges, which overlap differently) and memory. Terms add up over
tables, so the planner can update a plan's cost table by table instead of
re-evaluating it. Volumes follow the engine (``lightning_embark.engine.volume``):
RB sends ``B`` lengths and its IDs to every block and gets ``B`` pooled rows back per
block; UB sends its unique IDs split over row shards and gets one row per unique ID;
backward mirrors the rows with the backward codec; IDs are int32.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from lightning_embark.engine.codecs import codec_for
from lightning_embark.engine.plan import ClusterPlan, ClusterType, Compression
from lightning_embark.planner.calibration import Calibration

(LOOKUP, CODEC, FI_S, FI_R, FE_S, FE_R, HI_S, HI_R, HE_S, HE_R, MEM) = range(11)
NUM_TERMS = 11
ID_BYTES = 4


@dataclass(frozen=True, kw_only=True)
class TableLoad:
    """What one table costs whatever its layout: ``B``, ``h``, unique IDs, width, rows."""

    batch: int
    hotness: float
    unique: float
    dim: int
    rows: int


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
        return calib.piece_seconds + calib.cast_piece_seconds, 1.0 / (calib.cast_codec_bandwidth or calib.codec_bandwidth)
    bandwidth = (calib.int8_codec_bandwidth if compression is Compression.INT8 else None) or calib.codec_bandwidth
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
        return rows * (width * (c.weight_bytes + c.optimizer_bytes_per_element) + c.optimizer_bytes_per_row)

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
        return (load.batch * c.unique_pool_bag_seconds + ids * c.unique_pool_id_seconds
                + load.unique * c.unique_pool_row_seconds + ids * load.dim * 4 / c.unique_pool_bandwidth)

    def updated(self, unique_per_requester: float, num_requesters: int, block_rows: float) -> float:
        """Backward seconds of updating the distinct rows of one block: every requester's
        distinct IDs in it, as if no two requesters shared one (an upper bound), at most
        the block's rows."""
        return min(block_rows, num_requesters * unique_per_requester) * self.calib.update_row_seconds

    def dp(self, load: TableLoad) -> np.ndarray:
        """A replica on every rank: local lookup, the update of the rows any rank touched
        (after the all-reduce) and memory; the all-reduce is per cluster."""
        out = np.zeros((NUM_TERMS, self.world))
        c = self.calib
        out[LOOKUP] = (load.batch * load.hotness * load.dim * 4 * (1 + c.backward_lookup_factor) / c.lookup_bandwidth
                       + self.handling(load.batch, load.batch * load.hotness)
                       + self.updated(load.unique, self.world, load.rows))
        out[MEM] = self.element_bytes(load.rows, load.dim)
        return out

    def sharded(
        self, load: TableLoad, cluster: ClusterPlan, k: int, c: int, groups: tuple[tuple[int, ...], ...]
    ) -> np.ndarray:
        """An RB or UB table with ``k`` row and ``c`` column shards per replica group."""
        cal, world, local = self.calib, self.world, self.local
        ub = cluster.type is ClusterType.UB
        w = load.dim // c
        per_shard = load.unique / k
        ids = ID_BYTES * per_shard if ub else ID_BYTES * (load.batch + load.batch * load.hotness / k)
        rows_back = per_shard if ub else float(load.batch)
        read_rows = per_shard if ub else load.batch * load.hotness / k
        fwd = rows_back * self._rb(cluster.forward_compression, w, False)
        bwd = rows_back * self._rb(cluster.backward_compression, w, True)
        a, b = ids + bwd, fwd
        piece, codec_byte = piece_and_codec(cal, cluster.forward_compression)
        codec_pair = 2 * rows_back * w * 4 * codec_byte
        hier = cluster.hierarchical and self.hosts > 1
        xi, xe = (HI_S, HE_S) if hier else (FI_S, FE_S)
        out = np.zeros((NUM_TERMS, world))
        r = len(groups)
        shard_rows = -(-load.rows // k)
        group_of = self.ranks * r // world
        nb = k * c
        for g, owners in enumerate(groups):
            o = np.asarray(owners)
            lo, hi = int(np.searchsorted(group_of, g)), int(np.searchsorted(group_of, g, side="right"))
            qn = hi - lo
            own = np.bincount(o, minlength=world).astype(float)
            nbh = np.bincount(o // local, minlength=self.hosts).astype(float)
            rq_host = np.bincount(self.ranks[lo:hi] // local, minlength=self.hosts).astype(float)
            # requesters of this group
            q = slice(lo, hi)
            n_in = nbh[self.host[q]] - own[q]
            n_out = nb - nbh[self.host[q]]
            # owners
            in_group = (self.ranks >= lo) & (self.ranks < hi)
            req_in = own * (rq_host[self.host] - in_group)
            req_out = own * (qn - rq_host[self.host])
            out[LOOKUP] += own * qn * (read_rows * w * 4 * (1 + cal.backward_lookup_factor) / cal.lookup_bandwidth
                                       + self.handling(rows_back, read_rows))
            out[LOOKUP] += own * self.updated(per_shard, qn, shard_rows)
            out[CODEC] += codec_pair * (own * qn)
            out[CODEC, q] += codec_pair * nb
            out[LOOKUP] += piece * (own * qn)
            out[LOOKUP, q] += piece * nb
            out[MEM] += own * self.element_bytes(shard_rows, w)
            out[xi, q] += a * n_in
            out[xi + 1, q] += b * n_in
            out[xi] += b * req_in
            out[xi + 1] += a * req_in
            if not hier:
                out[FE_S, q] += a * n_out
                out[FE_R, q] += b * n_out
                out[FE_S] += b * req_out
                out[FE_R] += a * req_out
                continue
            spread = (local - 1) / local
            if ub:
                across_req, across_own = n_out, req_out
                out[HE_S, q] += a * n_out
                out[HE_R, q] += b * n_out
                out[HE_S] += b * req_out
                out[HE_R] += a * req_out
                moved_req, moved_own = (a + b) * across_req * spread, (a + b) * across_own * spread
            else:  # HostReduce: one pooled row per (sample, column shard) and host crosses hosts
                kept = np.minimum(c, nbh)
                rho = np.divide(kept, nbh, out=np.ones_like(nbh), where=nbh > 0)
                other = kept.sum() - kept[self.host[q]]
                out[HE_S, q] += ids * n_out + bwd * other
                out[HE_R, q] += fwd * other
                out[HE_S] += fwd * req_out * rho[self.host]
                out[HE_R] += (ids + bwd * rho[self.host]) * req_out
                moved_req = ids * n_out * spread
                moved_own = (fwd + bwd) * req_out + ids * req_out * spread
            out[HI_S, q] += moved_req
            out[HI_R, q] += moved_req
            out[HI_S] += moved_own
            out[HI_R] += moved_own
        if k > 1:  # every requester routes its IDs (UB: its unique IDs) to the row shards
            out[LOOKUP] += route_seconds(cal, load, unique_based=ub)
        if ub:
            out[LOOKUP] += self.unique_pooling(load)
        if r > 1:
            self._replica_sync(out, load, k, c, groups, hier)
        return out

    def _replica_sync(self, out: np.ndarray, load: TableLoad, k: int, c: int, groups, hier: bool) -> None:
        """Replicated blocks exchange ``[id | fp32 row]`` per row their group updated."""
        w = load.dim // c
        requesters = self.world / len(groups)
        rows = min(load.rows / k, requesters * load.unique / k)
        size = rows * (ID_BYTES + 4 * w)
        for g, owners in enumerate(groups):
            for other, peers in enumerate(groups):
                if other == g:
                    continue
                for src, dst in zip(owners, peers):
                    if src == dst:
                        continue
                    same = self.host[src] == self.host[dst]
                    base = (HI_S if hier else FI_S) if same else (HE_S if hier else FE_S)
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
        bandwidth = (cal.allreduce_bandwidth or cal.inter_bandwidth) if across else cal.intra_bandwidth
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


def link_seconds(terms: np.ndarray, calib: Calibration) -> tuple[np.ndarray, np.ndarray]:
    """Per-rank seconds on intra- and inter-host links: flat exchanges run both link
    classes at once, hierarchical stages run one after the other (the inter-host one at
    the calibrated efficiency of that stage)."""
    fi = np.maximum(terms[FI_S], terms[FI_R]) / calib.intra_bandwidth
    fe = np.maximum(terms[FE_S], terms[FE_R]) / calib.inter_bandwidth
    hi = np.maximum(terms[HI_S], terms[HI_R]) / calib.intra_bandwidth
    he = np.maximum(terms[HE_S], terms[HE_R]) / (calib.inter_bandwidth * calib.hierarchical_inter_efficiency)
    intra = np.where(fi >= fe, fi, 0.0) + hi
    inter = np.where(fi >= fe, 0.0, fe) + he
    return intra, inter
