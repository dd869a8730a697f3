"""UVM caching: blocks larger than their ranks' HBM in host memory behind an HBM cache.

On GPU hardware whose calibration gives a host link (``host_link_bandwidth``), a plan
that does not fit HBM need not be infeasible: fbgemm's ``MANAGED_CACHING`` keeps a
block's weights in unified (host) memory and a share ``f`` of its rows (the layout's
``cache_load_factor``) in an HBM cache. This module prices such a cache and sizes it.

Miss rate. IDs are drawn independently from a Zipf law over the block's ``N`` rows,
``P(rank i) = i^-alpha / H(N, alpha)`` with the generalized harmonic number
``H(n, alpha) = sum_{i=1..n} i^-alpha`` (the HugeCTR specs' keys: alpha 1.1). A cache of
``C = f N`` rows that holds the ``C`` most popular rows misses

    miss(C, N, alpha) = 1 - H(C, alpha) / H(N, alpha)

of the accesses (``1 - C / N`` for uniform IDs). That is the steady state of an ideal
frequency-based cache under the independent-reference model: a *lower bound* on an LRU
cache's misses (fbgemm's default, ``CacheAlgorithm.LRU``), which also evicts popular rows
between their uses; the estimate is optimistic by that gap. A row shard of a hashed table
sees every ``k``-th popularity rank, which is again Zipf with the same ``alpha`` over
``N / k`` rows; a range-split table's shards are treated the same way (the synthetic
data scatters popularity ranks over the ID space, so no shard holds all the hot IDs).

Miss cost. A miss fetches the row from host memory into the cache and evicts a row that
training has dirtied, which is written back: one row each way per miss, which overlap on
the duplex link, so a step's misses cost ``fetched * width * bytes / host_link_bandwidth``
seconds, ``bytes`` being the weight plus any element-wise optimizer state (which fbgemm
keeps in UVM with the weights). Rows fetched per step are at most the block's distinct
rows in the step (fbgemm prefetches each distinct row once per batch) and at most the
missing accesses: ``min(distinct, miss * accesses)``.

Sizing. The greedy lays tables out as if HBM were as large as the host memory, then gives
every rank that overflows its HBM one cache factor for all its sharded blocks, the
largest that fits (:func:`assign_caches`); a table takes the smallest factor of its
ranks. The layout does not yet weigh the misses (hot tables are not kept out of UVM),
but their price is in the plan's estimate.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from lightning_embark.errors import PlanInfeasibleError
from lightning_embark.plan import CACHE_INDEX_BYTES, CACHE_SLOT_BYTES, ClusterType, Plan, is_cached
from lightning_embark.planner._hardware import Calibration

#: Terms of the generalized harmonic number summed exactly; beyond, Euler-Maclaurin.
EXACT_TERMS = 1024
#: Cache factors are rounded down to this many decimals so that a plan written as JSON
#: and read back fits exactly as planned.
_FACTOR_DECIMALS = 6


def generalized_harmonic(n: float, alpha: float) -> float:
    """``H(n, alpha) = sum_{i=1..floor(n)} i^-alpha``, exact to about 1e-11 in O(1) time.

    The first :data:`EXACT_TERMS` terms are summed directly; the rest by Euler-Maclaurin
    with the ``B_2`` term:
    ``sum_{i=m+1..n} f(i) = int_m^n f + (f(n) - f(m)) / 2 + (f'(n) - f'(m)) / 12 + R``
    with ``f(x) = x^-alpha``. The remainder is bounded by
    ``2 zeta(3) / (2 pi)^3 * int_m^n |f'''| <= 0.0097 * alpha (alpha + 1) m^(-alpha - 2)``:
    for ``m = 1024`` at most 6e-10 absolute (the bound peaks near ``alpha = 0.16``; 1e-11
    at 1.1), against ``H >= 1``.
    """
    n = math.floor(n)
    if n <= 0:
        return 0.0
    m = min(n, EXACT_TERMS)
    head = float(np.sum(np.arange(1, m + 1, dtype=np.float64) ** -alpha))
    if n == m:
        return head
    if abs(alpha - 1.0) < 1e-12:
        integral = math.log(n / m)
    else:
        integral = (n ** (1.0 - alpha) - m ** (1.0 - alpha)) / (1.0 - alpha)
    ends = (n**-alpha - m**-alpha) / 2.0
    slope = (-alpha * n ** (-alpha - 1.0) + alpha * m ** (-alpha - 1.0)) / 12.0
    return head + integral + ends + slope


def miss_rate(cache_rows: float, rows: float, alpha: float | None) -> float:
    """Share of accesses that miss a cache of the ``cache_rows`` most popular of ``rows``
    rows: ``1 - H(C, alpha) / H(N, alpha)`` for Zipf(``alpha``) IDs, ``1 - C / N`` for
    uniform ones (``alpha`` None). An ideal frequency cache's misses, a lower bound on
    LRU's (module docstring)."""
    if rows <= 0 or cache_rows >= rows:
        return 0.0
    if cache_rows < 1:
        return 1.0
    if alpha is None:
        return 1.0 - math.floor(cache_rows) / rows
    return max(
        0.0, 1.0 - generalized_harmonic(cache_rows, alpha) / generalized_harmonic(rows, alpha)
    )


def miss_seconds(
    calib: Calibration,
    *,
    cache_load_factor: float,
    block_rows: float,
    width: int,
    accesses: float,
    distinct: float,
    alpha: float | None,
) -> float:
    """Seconds per step one cached block spends moving missed rows over the host link.

    Args:
        calib: Its ``host_link_bandwidth`` prices the rows (must be set).
        cache_load_factor: The block's cached share of rows.
        block_rows: Its rows ``N``.
        width: Its width.
        accesses: Row reads per step, all requesters together.
        distinct: Distinct rows per step, at most (fbgemm fetches each once per batch).
        alpha: The IDs' Zipf exponent; None for uniform IDs.
    """
    assert calib.host_link_bandwidth is not None, "UVM caching needs a host link bandwidth"
    miss = miss_rate(cache_load_factor * block_rows, block_rows, alpha)
    fetched = min(distinct, miss * accesses)
    row_bytes = width * (calib.weight_bytes + calib.optimizer_bytes_per_element)
    return fetched * row_bytes / calib.host_link_bandwidth


def uvm_enabled(calib: Calibration) -> bool:
    """Whether the hardware can cache blocks in UVM: a GPU preset with a host link, an HBM
    size and a host memory larger than it (CPU calibrations have neither split nor link)."""
    return (
        calib.host_link_bandwidth is not None
        and calib.memory_per_rank is not None
        and calib.host_memory_per_rank is not None
        and calib.host_memory_per_rank > calib.memory_per_rank
    )


def assign_caches(
    plan: Plan,
    *,
    stored: np.ndarray,
    buffers: np.ndarray,
    rows_of: dict[str, int],
    dims: dict[str, int],
    calib: Calibration,
    memory_fraction: float,
) -> Plan:
    """``plan`` with cache factors on the sharded tables of every rank over its HBM.

    A rank's HBM with all its sharded blocks cached at ``f`` is
    ``fixed + f * slots`` (:func:`~lightning_embark.plan._cache.hbm_block_bytes`), which
    must stay within ``memory_fraction * memory_per_rank`` and, with its exchange
    buffers, within ``memory_per_rank``: the largest such ``f`` (rounded down) is the
    rank's; each table takes the smallest of its overflowing ranks' factors.

    Args:
        plan: A plan laid out without an HBM limit.
        stored: Per rank, HBM bytes of its blocks if wholly in HBM (the cost terms' MEM).
        buffers: Per rank, exchange buffer bytes.
        rows_of: Rows per table.
        dims: Width per table.
        calib: The hardware (``memory_per_rank`` is HBM).
        memory_fraction: The greedy's share of HBM for stored blocks.

    Raises:
        PlanInfeasibleError: a rank's uncacheable part (DP tables, row-wise optimizer
            state, cache index, buffers) alone overflows its HBM; names the rank, a table
            and the shortfall.
    """
    assert calib.memory_per_rank is not None
    world = plan.world_size
    full = np.zeros(world)  # bytes of sharded blocks if wholly in HBM
    slots = np.zeros(world)  # HBM bytes per unit of cache factor
    kept = np.zeros(world)  # HBM bytes of cached blocks whatever the factor
    largest: list[tuple[float, str]] = [(0.0, "")] * world
    clusters = {c.name: c for c in plan.clusters}
    element = calib.weight_bytes + calib.optimizer_bytes_per_element
    for layout in plan.tables:
        if clusters[layout.cluster].type is ClusterType.DP:
            continue
        width = dims[layout.table] // layout.num_col_shards
        for group in layout.ranks:
            for block, rank in enumerate(group):
                rows = layout.shard_rows(block // layout.num_col_shards, rows_of[layout.table])
                size = rows * (width * element + calib.optimizer_bytes_per_row)
                full[rank] += size
                slots[rank] += rows * (width * calib.weight_bytes + CACHE_SLOT_BYTES)
                kept[rank] += rows * (CACHE_INDEX_BYTES + calib.optimizer_bytes_per_row)
                largest[rank] = max(largest[rank], (size, layout.table))
    limit = float(calib.memory_per_rank)
    capacity = memory_fraction * limit
    fixed = stored - full + kept
    with np.errstate(divide="ignore", invalid="ignore"):
        room = np.minimum(capacity - fixed, limit - fixed - buffers)
        factor = np.where(slots > 0, room / slots, np.inf)
    over = (stored > capacity) | (stored + buffers > limit)
    scale = 10**_FACTOR_DECIMALS
    for rank in map(int, np.flatnonzero(over)):
        if math.floor(min(1.0, float(factor[rank])) * scale) <= 0:
            short = float(max(fixed[rank] - capacity, fixed[rank] + buffers[rank] - limit))
            raise PlanInfeasibleError(
                f"rank {rank} does not fit its HBM even with every sharded block cached in "
                f"UVM: DP tables, row-wise optimizer state, cache indices and exchange "
                f"buffers need {fixed[rank] / 2**30:.2f} GiB (+{buffers[rank] / 2**30:.2f} GiB "
                f"buffers) of {limit / 2**30:.2f} GiB (short by {short / 2**30:.2f} GiB; its "
                f"largest block is of table {largest[rank][1]!r}); add ranks, lower "
                "--batch-size or cap rows with --max-rows",
                table=largest[rank][1],
                shortfall_bytes=short,
            )
    rank_factor = {
        int(r): math.floor(min(1.0, float(factor[r])) * scale) / scale
        for r in np.flatnonzero(over)
    }
    layouts = []
    for layout in plan.tables:
        factors = [rank_factor[r] for group in layout.ranks for r in group if r in rank_factor]
        if clusters[layout.cluster].type is ClusterType.DP or not factors or min(factors) >= 1:
            layouts.append(layout)
            continue
        layouts.append(dataclasses.replace(layout, cache_load_factor=min(factors)))
    return dataclasses.replace(plan, tables=tuple(layouts))


def cached_tables(plan: Plan) -> list[str]:
    """The plan's tables held in UVM behind an HBM cache."""
    return [t.table for t in plan.tables if is_cached(t.cache_load_factor)]
