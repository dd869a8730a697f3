"""HBM bytes of a block held in UVM behind an HBM cache (fbgemm ``MANAGED_CACHING``).

A table layout's ``cache_load_factor`` ``f`` in ``(0, 1)`` keeps its blocks' weights in
unified (host) memory and ``f`` of their rows in an HBM cache; absent (or 1) keeps them
wholly in HBM. What stays in HBM follows fbgemm-gpu 1.8's
``SplitTableBatchedEmbeddingBagsCodegen`` (``_apply_split`` / ``_apply_cache_state``):

* the cache's weights: ``f * rows`` slots of the block's width;
* per cache slot, ``lxu_cache_state`` and ``lxu_state`` (int64 each, LRU):
  :data:`CACHE_SLOT_BYTES`;
* per row of the *whole* block, ``cache_index_table_map`` (int32):
  :data:`CACHE_INDEX_BYTES`;
* a row-wise optimizer state (row-wise Adagrad's accumulator) stays in HBM; an
  element-wise one moves to UVM with the weights.

Kept apart from :mod:`._types` so that the plan's check and the planner's cost model
count the same bytes.
"""

from __future__ import annotations

import math

from lightning_embark.errors import ConfigError

#: HBM bytes per cache slot: fbgemm's ``lxu_cache_state`` and ``lxu_state`` (int64 each).
CACHE_SLOT_BYTES = 16
#: HBM bytes per row of a cached block: fbgemm's ``cache_index_table_map`` (int32).
CACHE_INDEX_BYTES = 4


def check_cache_load_factor(value: object, where: str) -> float | None:
    """``value`` as a cache load factor: None (no cache) or a float in ``(0, 1]``.

    Raises:
        ConfigError: anything else, naming ``where``, the value and the fix.
    """
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not 0 < value <= 1
    ):
        raise ConfigError(
            f"{where}: cache_load_factor must be a number in (0, 1] (the share of the "
            f"block's rows cached in HBM; 1 or null keeps it wholly in HBM), got {value!r}"
        )
    return float(value)


def is_cached(cache_load_factor: float | None) -> bool:
    """Whether a block with this factor lives in UVM behind a cache (factor below 1)."""
    return cache_load_factor is not None and cache_load_factor < 1.0


def hbm_block_bytes(
    rows: float,
    width: int,
    cache_load_factor: float | None,
    *,
    element_bytes: float,
    row_bytes: float = 0.0,
) -> float:
    """HBM bytes of a block of ``rows`` x ``width``.

    Args:
        rows: The block's rows.
        width: Its width.
        cache_load_factor: None or 1: wholly in HBM; below 1: cached (module docstring).
        element_bytes: HBM bytes per element when wholly in HBM (weights plus any
            element-wise optimizer state); when cached, per element of a cache slot.
        row_bytes: Bytes per row that stay in HBM either way (a row-wise optimizer state).
    """
    if not is_cached(cache_load_factor):
        return rows * (width * element_bytes + row_bytes)
    assert cache_load_factor is not None
    slots = cache_load_factor * rows
    return slots * (width * element_bytes + CACHE_SLOT_BYTES) + rows * (
        CACHE_INDEX_BYTES + row_bytes
    )
