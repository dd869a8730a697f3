"""Alternating paired repeats of a headline row, and the ratios taken over them.

The shared 2-core machine drifts during an hour-long suite. Repeat ``r`` runs the
strategies in an order rotated by ``r`` (:func:`rotated`), so that a drift hits every
strategy alike, and each ratio to a baseline is taken within a repeat, between runs that
ran back to back, before its median over repeats (:func:`aggregate`).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

#: The rows every other row is compared with, per repeat.
BASELINES = ("torchrec-twrw", "torchrec-fp16")


def rotated(items: Sequence[str], repeat: int) -> list[str]:
    """``items`` rotated left by ``repeat``: repeat ``r`` starts with item ``r mod n``, so
    over ``n`` repeats every strategy runs once in every position."""
    if not items:
        return []
    k = repeat % len(items)
    return [*items[k:], *items[:k]]


def quantile(values: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default): position ``q (n - 1)`` of the
    sorted values."""
    if not values:
        raise ValueError("quantile of no values")
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def inter_host_mb(run: dict[str, Any]) -> tuple[float, float]:
    """Inter-host MB per step (summed over ranks) of a run's embedding part and of its dense
    gradients (``bytes_per_step``: ``embedding_inter_host`` and ``by_traffic["dense"]``)."""
    per_step = run["bytes_per_step"]
    dense = per_step.get("by_traffic", {}).get("dense", {}).get("inter_host", 0)
    embedding = per_step.get("embedding_inter_host", per_step["inter_host"] - dense)
    return embedding / 1e6, dense / 1e6


def aggregate(
    repeats: Sequence[dict[str, dict[str, Any]]],
    labels: Sequence[str],
    baselines: Sequence[str] = BASELINES,
) -> dict[str, dict[str, Any]]:
    """Per row: step time over repeats and the paired ratios against each baseline.

    A run's step time is its median over measured steps (the slowest rank's per step). Per
    row: the median over repeats of those medians, with p10 and p90 across the repeats'
    medians (:func:`quantile`). The ratio to a baseline ``b`` is taken within each repeat,
    ``T_row,r / T_b,r`` (both ran back to back, paired), then its median over repeats. The
    exchange share and the inter-host MB are medians over repeats too (bytes repeat exactly).
    """
    out: dict[str, dict[str, Any]] = {}
    for label in labels:
        steps = [rep[label]["step_time_ms"]["median"] for rep in repeats]
        ratios: dict[str, dict[str, Any]] = {}
        for base in baselines:
            if base not in labels:
                continue
            paired = [
                rep[label]["step_time_ms"]["median"] / rep[base]["step_time_ms"]["median"]
                for rep in repeats
            ]
            ratios[base] = {"median": statistics.median(paired), "per_repeat": paired}
        mb = [inter_host_mb(rep[label]) for rep in repeats]
        out[label] = {
            "step_ms": {
                "median": statistics.median(steps),
                "p10": quantile(steps, 0.1),
                "p90": quantile(steps, 0.9),
                "per_repeat": steps,
            },
            "ratio": ratios,
            "comm_share": statistics.median(rep[label]["comm_share"] for rep in repeats),
            "embedding_inter_mb": statistics.median(e for e, _ in mb),
            "dense_inter_mb": statistics.median(d for _, d in mb),
            "dense_compression": "/".join(
                sorted({str(rep[label].get("dense_compression", "?")) for rep in repeats})
            ),
            "dense_exchange": "/".join(
                sorted({str(rep[label].get("dense_exchange", "?")) for rep in repeats})
            ),
            "num_repeats": len(repeats),
        }
    return out
