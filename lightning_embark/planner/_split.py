"""Per-table decisions of the greedy planner: cluster type, data parallelism, 3D split.

These use closed-form scalar costs (seconds) rather than the per-rank terms of the
full model, so that choosing among a table's candidate ``(k, c)`` splits is a few
arithmetic operations: the planner must handle a thousand tables in well under a
second. The full model judges the finished plan.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lightning_embark.plan import ClusterType, Compression
from lightning_embark.planner._hardware import Calibration
from lightning_embark.planner._terms import (
    ID_BYTES,
    TableLoad,
    piece_and_codec,
    route_seconds,
    row_bytes,
)


@dataclass(frozen=True, kw_only=True)
class Split:
    """One candidate layout shape and its scalar costs (seconds).

    Attributes:
        k: Row shards.
        c: Column shards.
        block: Cost one block puts on its owner (lookup plus serving every requester).
        total: Cost summed over all ranks (blocks plus every requester's side).
        block_bytes: Stored bytes of one block.
    """

    k: int
    c: int
    block: float
    total: float
    block_bytes: float


class Shape:
    """The cluster shape and constants the scalar costs need."""

    def __init__(
        self, calib: Calibration, *, num_hosts: int, ranks_per_host: int, compression: Compression
    ) -> None:
        self.calib, self.hosts, self.local = calib, num_hosts, ranks_per_host
        self.world = num_hosts * ranks_per_host
        self.compression = compression
        inter = calib.inter_bandwidth if num_hosts > 1 else calib.intra_bandwidth
        self.inter_bw = inter
        # seconds per byte sent to every peer, and averaged over peers
        self.owner_intra = (ranks_per_host - 1) / calib.intra_bandwidth
        self.owner_inter = (self.world - ranks_per_host) / inter
        self.peer_avg = (ranks_per_host / self.world) / calib.intra_bandwidth + (
            1 - ranks_per_host / self.world
        ) / inter

    def element_bytes(self, rows: float, width: int) -> float:
        c = self.calib
        return rows * (
            width * (c.weight_bytes + c.optimizer_bytes_per_element) + c.optimizer_bytes_per_row
        )


def cluster_type(load: TableLoad, compression: Compression, threshold: float = 1.0) -> ClusterType:
    """UB where moving unique rows (plus their IDs) costs less than ``threshold`` times
    ``B`` pooled rows (plus theirs)."""
    rows = row_bytes(compression, load.dim, backward=False) + row_bytes(
        compression, load.dim, backward=True
    )
    rb = load.batch * rows + ID_BYTES * load.batch * (1 + load.hotness)
    ub = load.unique * (rows + ID_BYTES)
    return ClusterType.UB if ub < threshold * rb else ClusterType.RB


def dp_seconds(load: TableLoad, shape: Shape) -> float:
    """Per-rank cost of replicating the table: all-reduce share, local lookup and the
    dense gradient pass over the replica (calibrated; 0 in the datasheet presets)."""
    world, calib = shape.world, shape.calib
    size = 4 * load.rows * load.dim
    allreduce = 2 * (world - 1) / world * size / (calib.allreduce_bandwidth or shape.inter_bw)
    lookup = (
        load.batch
        * load.hotness
        * load.dim
        * 4
        * (1 + calib.backward_lookup_factor)
        / calib.lookup_bandwidth
    )
    handling = (
        load.batch * calib.lookup_bag_seconds + load.batch * load.hotness * calib.lookup_id_seconds
    )
    dense = size / calib.dp_dense_bandwidth if calib.dp_dense_bandwidth else 0.0
    update = min(load.rows, world * load.unique) * calib.update_row_seconds
    return allreduce + lookup + handling + dense + update


def _split_costs(
    load: TableLoad,
    kind: ClusterType,
    k: np.ndarray,
    c: np.ndarray,
    shape: Shape,
    hierarchical: bool,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Block cost, total cost and block bytes of ``(1, k, c)`` layouts, elementwise.

    The same terms as :meth:`TermModel.sharded` for one replica group spread evenly:
    bytes read, per-bag/per-ID handling, the fixed cost per exchanged piece and the
    codec passes at the owner for every requester, the update of the block's distinct
    rows, and the link time of serving them (row shards of a column shard share a host
    where they fit, so a hierarchical RB exchange sends one pooled row per host); each
    requester pays its pieces, codec passes and link time per block, and routes its IDs
    when the table is row-split.
    """
    calib, comp = shape.calib, shape.compression
    kf, cf = k.astype(float), c.astype(float)
    w = load.dim // c
    ub = kind is ClusterType.UB
    ids = ID_BYTES * (load.unique / kf if ub else load.batch * (1 + load.hotness / kf))
    back = load.unique / kf if ub else np.full_like(kf, float(load.batch))
    fwd = back * np.array([row_bytes(comp, int(x), backward=False) for x in w])
    bwd = back * np.array([row_bytes(comp, int(x), backward=True) for x in w])
    rho = 1.0 / np.minimum(kf, shape.local) if (hierarchical and not ub) else np.ones_like(kf)
    read = load.unique / kf if ub else load.batch * load.hotness / kf
    piece, codec_byte = piece_and_codec(calib, comp)
    codec = 2 * back * w * 4 * codec_byte
    per_requester = (
        read * w * 4 * (1 + calib.backward_lookup_factor) / calib.lookup_bandwidth
        + back * calib.lookup_bag_seconds
        + read * calib.lookup_id_seconds
        + piece
        + codec
    )
    update = (
        np.minimum(-(-load.rows // k), shape.world * load.unique / kf) * calib.update_row_seconds
    )
    far = np.maximum(ids + rho * bwd, rho * fwd)
    block = (
        shape.world * per_requester
        + update
        + shape.owner_intra * np.maximum(ids + bwd, fwd)
        + shape.owner_inter * far
    )
    routed = route_seconds(calib, load, unique_based=ub)
    requester = kf * cf * (far * shape.peer_avg + piece + codec) + np.where(kf > 1, routed, 0.0)
    total = kf * cf * block + shape.world * requester
    rows = -(-load.rows // k)
    block_bytes = rows * (
        w * (calib.weight_bytes + calib.optimizer_bytes_per_element)
        + calib.optimizer_bytes_per_row
    )
    return block, total, block_bytes.astype(float)


def split_cost(
    load: TableLoad, kind: ClusterType, k: int, c: int, shape: Shape, hierarchical: bool
) -> Split:
    """Scalar costs of one ``(1, k, c)`` layout (see :func:`_split_costs`)."""
    block, total, block_bytes = _split_costs(
        load, kind, np.array([k]), np.array([c]), shape, hierarchical
    )
    return Split(
        k=k, c=c, block=float(block[0]), total=float(total[0]), block_bytes=float(block_bytes[0])
    )


def candidate_shapes(
    load: TableLoad,
    shape: Shape,
    *,
    min_col_width: int,
    max_blocks: int,
    max_row_shards: int | None = None,
    max_col_shards: int | None = None,
) -> list[tuple[int, int]]:
    """``(k, c)`` pairs: ``c`` divides the width (columns at least ``min_col_width``),
    ``k`` a power of two up to a host or a whole number of hosts, at most ``max_blocks``
    blocks, ``k`` and ``c`` within their caps (``(1, 1)`` always stays)."""
    max_k = max_row_shards or load.rows
    max_c = max_col_shards or load.dim
    cols = [
        c
        for c in range(1, load.dim + 1)
        if load.dim % c == 0 and (c == 1 or load.dim // c >= min_col_width)
    ]
    rows = sorted(
        {2**i for i in range(shape.local.bit_length()) if 2**i <= shape.local}
        | {shape.local * m for m in range(1, shape.hosts + 1)}
    )
    return [
        (k, c)
        for k in rows
        if k <= min(load.rows, max_k)
        for c in cols
        if c <= max_c and k * c <= max_blocks
    ]


class Candidates:
    """Every candidate split of one table, costed at once with numpy (the planner tries
    several load targets; the costs do not depend on the target, so they are kept)."""

    def __init__(
        self,
        load: TableLoad,
        kind: ClusterType,
        shape: Shape,
        *,
        min_col_width: int,
        hierarchical: bool,
        max_row_shards: int | None = None,
        max_col_shards: int | None = None,
    ):
        pairs = candidate_shapes(
            load,
            shape,
            min_col_width=min_col_width,
            max_blocks=shape.world,
            max_row_shards=max_row_shards,
            max_col_shards=max_col_shards,
        )
        self.k = np.array([p[0] for p in pairs], dtype=np.int64)
        self.c = np.array([p[1] for p in pairs], dtype=np.int64)
        self.block, self.total, self.bytes = _split_costs(
            load, kind, self.k, self.c, shape, hierarchical
        )

    def choose(self, *, target: float, cap: float) -> Split | None:
        """The cheapest split whose blocks stay under ``target`` seconds and ``cap`` bytes;
        failing the target, the one with the cheapest block that fits; None if none fits."""
        fits = self.bytes <= cap
        if not fits.any():
            return None
        good = fits & (self.block <= target)
        blocks = self.k * self.c
        if good.any():
            keys = (self.k, blocks, np.where(good, self.total, np.inf))
        else:
            keys = (blocks, np.where(fits, self.total, np.inf), np.where(fits, self.block, np.inf))
        i = int(np.lexsort(keys)[0])
        return Split(
            k=int(self.k[i]),
            c=int(self.c[i]),
            block=float(self.block[i]),
            total=float(self.total[i]),
            block_bytes=float(self.bytes[i]),
        )

    def smallest_block_bytes(self) -> float:
        return float(self.bytes.min())
