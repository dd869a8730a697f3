"""A headline row's statistics over its paired repeats, each with an interval that holds.

On the shared machine a strategy's step moves by tens of percent between repeats, so a
median alone cannot separate a 10-20% difference. Every figure compared across strategies
is taken within a repeat first (the runs of a repeat ran minutes apart; the two links of
a run back to back, :mod:`~_headline.paired`), then summarised over repeats with the
Wilcoxon signed-rank interval of ``lightning_embark.harness``: for a ratio on its logs
(``ratio_interval``: a ratio's noise is multiplicative), for the exposed milliseconds as
they are (``wilcoxon_interval``). The estimate is Hodges-Lehmann's (the median of the
Walsh averages); the achieved level is kept, since 5 values reach at most 93.75% and 6
are the least that reach 95% (96.9%). The plain median over repeats is kept beside it.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

#: The rows every other row is compared with, per repeat: torchrec's own planner and its
#: fp16 qcomms (what a torchrec user runs), and the EMBark paper's table-row-wise baseline.
BASELINES = ("torchrec", "torchrec-fp16", "torchrec-twrw")


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


def ratio_stats(ratios: Sequence[float]) -> dict[str, Any]:
    """Paired ratios over repeats: each, their median, and ``ratio_interval`` (estimate,
    low, high, achieved confidence, n)."""
    from lightning_embark.harness import ratio_interval

    values = list(ratios)
    return {
        "per_repeat": values,
        "median": statistics.median(values),
        "interval": ratio_interval(values).to_dict(),
    }


def difference_stats(values: Sequence[float]) -> dict[str, Any]:
    """Paired differences (ms) over repeats: each, their median, and ``wilcoxon_interval``."""
    from lightning_embark.harness import wilcoxon_interval

    out = list(values)
    return {
        "per_repeat": out,
        "median": statistics.median(out),
        "interval": wilcoxon_interval(out).to_dict(),
    }


def spread(run: dict[str, Any]) -> float:
    """A run's within-run spread of the step, ``p90 / p10`` over its measured steps (1: every
    step alike). A ratio, so that a longer step is not a wider spread by itself."""
    step = run["step_time_ms"]
    return step["p90"] / step["p10"]


def _divided(values: Sequence[float], by: Sequence[float]) -> list[float]:
    """``values[r] / by[r]`` per repeat ``r``: the paired ratios."""
    return [v / b for v, b in zip(values, by, strict=True)]


def _median_or_none(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known and len(known) == len(values) else None


def _joined(repeats: Sequence[dict[str, dict[str, Any]]], label: str, key: str) -> str:
    return "/".join(sorted({str(rep[label].get(key, "?")) for rep in repeats}))


def _towers(runs: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """A tower row's towers over repeats: the count per repeat, whether every repeat had
    towers (``all``), any did (``any``), their modules, and the planner's choice and reason
    where the plans record one. None for a row without towers."""
    uses = [r["towers"] for r in runs if "towers" in r]
    if not uses:
        return None
    counts = [u["count"] for u in uses]
    return {
        "per_repeat": counts,
        "any": any(counts),
        "all": all(counts),
        "known": all(u.get("known", True) for u in uses),
        "modules": sorted({m for u in uses for m in u.get("modules", ())}),
        "choice": sorted({str(u["choice"]) for u in uses if u.get("choice") is not None}),
        "reason": next((u["reason"] for u in uses if u.get("reason")), None),
    }


def _exposed(
    repeats: Sequence[dict[str, dict[str, Any]]], label: str, baselines: Sequence[str]
) -> dict[str, Any]:
    """The exposed-communication figures of a row, where every repeat has them (None
    fields otherwise: ``--no-exposed``, or a loopback fallback)."""
    runs = [rep[label] for rep in repeats]
    if not all(r.get("exposed_ms") is not None and "unshaped" in r for r in runs):
        return {"exposed_ms": None, "exposed_share": None, "unshaped_step_ms": None}
    steps = [r["unshaped"]["step_time_ms"]["median"] for r in runs]
    ratios = {
        base: ratio_stats(
            _divided(steps, [rep[base]["unshaped"]["step_time_ms"]["median"] for rep in repeats])
        )
        for base in baselines
        if all(
            rep[base].get("exposed_ms") is not None and "unshaped" in rep[base] for rep in repeats
        )
    }
    shares = [r["exposed_share"] for r in runs]
    return {
        "exposed_ms": difference_stats([r["exposed_ms"] for r in runs]),
        "exposed_share": {"per_repeat": shares, "median": statistics.median(shares)},
        "unshaped_step_ms": {"per_repeat": steps, "median": statistics.median(steps)},
        "unshaped_ratio": ratios,
        "unshaped_cpu_ms_per_rank": _median_or_none(
            [r["unshaped"].get("cpu_ms_per_rank") for r in runs]
        ),
    }


def summarize(
    repeats: Sequence[dict[str, dict[str, Any]]],
    labels: Sequence[str],
    baselines: Sequence[str] = BASELINES,
) -> dict[str, dict[str, Any]]:
    """Per row label: its step over repeats, its paired ratios and exposed communication
    with their intervals, its CPU, spread, counter share and bytes.

    A run's step is its median over measured steps (the slowest rank's per step). Per row:

    * ``step_ms``: the median over repeats of those medians, with p10 and p90 across them
      (:func:`quantile`);
    * ``ratio[b]``: ``T_row,r / T_b,r`` within each repeat ``r`` (paired), for each
      baseline ``b`` that ran, with :func:`ratio_stats`;
    * ``unshaped_ratio[b]``: the same for the unshaped steps (the comparison with no link
      cost: what the engines cost before a byte crosses a link);
    * ``exposed_ms``: ``T_shaped,r - T_unshaped,r`` per repeat with :func:`difference_stats`,
      ``exposed_share`` its share of the shaped step, median over repeats;
    * ``spread``: each run's ``p90 / p10`` (:func:`spread`), and its median over repeats;
    * ``cpu_ms_per_rank``, ``comm_share`` (the strategy's own counter: the share of a step
      blocked in embedding all-to-alls), inter-host MB per step (bytes repeat exactly):
      medians over repeats.
    """
    out: dict[str, dict[str, Any]] = {}
    for label in labels:
        runs = [rep[label] for rep in repeats]
        steps = [r["step_time_ms"]["median"] for r in runs]
        spreads = [spread(r) for r in runs]
        mb = [inter_host_mb(r) for r in runs]
        out[label] = {
            "step_ms": {
                "median": statistics.median(steps),
                "p10": quantile(steps, 0.1),
                "p90": quantile(steps, 0.9),
                "per_repeat": steps,
            },
            "ratio": {
                base: ratio_stats(
                    _divided(steps, [rep[base]["step_time_ms"]["median"] for rep in repeats])
                )
                for base in baselines
                if base in labels
            },
            **_exposed(repeats, label, [b for b in baselines if b in labels]),
            "spread": {"per_repeat": spreads, "median": statistics.median(spreads)},
            "cpu_ms_per_rank": _median_or_none([r.get("cpu_ms_per_rank") for r in runs]),
            "comm_share": statistics.median(r["comm_share"] for r in runs),
            "embedding_inter_mb": statistics.median(e for e, _ in mb),
            "dense_inter_mb": statistics.median(d for _, d in mb),
            "dense_compression": _joined(repeats, label, "dense_compression"),
            "dense_exchange": _joined(repeats, label, "dense_exchange"),
            "pipelined": _joined(repeats, label, "pipelined"),
            "towers": _towers(runs),
            "num_repeats": len(repeats),
        }
    return out
