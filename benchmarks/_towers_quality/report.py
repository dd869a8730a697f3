"""The benchmark's tables (accuracy per variant, the partitions compared) and its figure.

A dataset's result is ``{"aucs": {label: [per seed]}, "seconds": {...}, "wire": {label:
ratio}, "kept": {label: [per seed]}, "rows": [train, val]}``; ``flat`` is always there.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from _towers_quality.stats import LOWER_BAR, MEAN_BAR, paired_interval

#: The partitions compared: (label, the learned variant, the other).
PARTITION_PAIRS = (
    ("learned - statistics-only", "dot r4", "dot r4 statistics-only"),
    ("learned - random", "dot r4", "dot r4 random"),
)


def _interval_text(low: float, high: float) -> str:
    return f"[{low:+.4f}, {high:+.4f}]"


def accuracy_table(name: str, result: Mapping[str, Any]) -> str:
    """Mean AUC, the paired difference to flat with its 95% interval, the bar, the wire
    ratio and the training time of every variant."""
    aucs, seconds, wire = result["aucs"], result["seconds"], result["wire"]
    flat, flat_s = aucs["flat"], statistics.mean(seconds["flat"])
    train, val = result["rows"]
    lines = [
        f"{name}: {train:,} training rows, {val:,} validation rows, {len(flat)} paired seeds",
        f"{'model':<26}{'wire':>6}{'mean AUC':>10}{'delta':>9}  {'95% interval':<20}"
        f"{'keeps':>6}{'train s':>9}{'x flat':>7}",
        "-" * 93,
    ]
    for label, values in aucs.items():
        mean_s = statistics.mean(seconds[label])
        time = f"{mean_s:>9.1f}{mean_s / flat_s:>7.2f}"
        if label == "flat":
            lines.append(
                f"{label:<26}{'-':>6}{statistics.mean(values):>10.4f}{'-':>9}  {'-':<20}"
                f"{'-':>6}{time}"
            )
            continue
        interval = paired_interval(values, flat)
        keeps = "yes" if interval.keeps_accuracy else "no"
        lines.append(
            f"{label:<26}{wire[label]:>5.2f}x{statistics.mean(values):>10.4f}"
            f"{interval.mean:>+9.4f}  {_interval_text(interval.low, interval.high):<20}"
            f"{keeps:>6}{time}"
        )
    lines.append(
        f"keeps: mean delta >= -{MEAN_BAR} and the interval's lower bound >= -{LOWER_BAR}"
    )
    return "\n".join(lines)


def partition_table(name: str, result: Mapping[str, Any]) -> str:
    """The learned partition against the statistics-only and the random one: the paired
    AUC difference with its 95% interval, and the affinity each keeps inside towers."""
    aucs, kept = result["aucs"], result.get("kept", {})
    lines = [
        f"{name}: partitions of dot r4 towers, paired over seeds",
        f"{'comparison':<28}{'delta AUC':>10}  {'95% interval':<20}{'kept affinity':>26}",
        "-" * 86,
    ]
    for label, mine, other in PARTITION_PAIRS:
        if mine not in aucs or other not in aucs:
            continue
        interval = paired_interval(aucs[mine], aucs[other])
        share = ""
        if mine in kept and other in kept:
            share = f"{statistics.mean(kept[mine]):.2f} vs {statistics.mean(kept[other]):.2f}"
        lines.append(
            f"{label:<28}{interval.mean:>+10.4f}  "
            f"{_interval_text(interval.low, interval.high):<20}{share:>26}"
        )
    return "\n".join(lines)


def plot(results: Mapping[str, Mapping[str, Any]], path: str | Path, caption: str) -> None:
    """One panel per dataset: every variant's mean AUC difference to flat with its 95%
    interval, and the bar (``-MEAN_BAR`` for the mean, ``-LOWER_BAR`` for the bound)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4.2), squeeze=False)
    for ax, (name, result) in zip(axes[0], results.items(), strict=True):
        aucs = result["aucs"]
        labels: Sequence[str] = [k for k in aucs if k != "flat"][::-1]
        for y, label in enumerate(labels):
            interval = paired_interval(aucs[label], aucs["flat"])
            color = "tab:green" if interval.keeps_accuracy else "tab:red"
            ax.errorbar(
                interval.mean,
                y,
                xerr=[[interval.mean - interval.low], [interval.high - interval.mean]],
                fmt="o",
                color=color,
                capsize=3,
            )
        ax.axvline(0.0, color="black", lw=0.8)
        ax.axvline(-MEAN_BAR, color="grey", ls="--", lw=0.8, label=f"mean bar -{MEAN_BAR}")
        ax.axvline(-LOWER_BAR, color="grey", ls=":", lw=0.8, label=f"bound bar -{LOWER_BAR}")
        ax.set_yticks(range(len(labels)), labels)
        ax.xaxis.set_major_locator(MaxNLocator(5))
        ax.set_xlabel("AUC(towered) - AUC(flat), mean and 95% paired-t interval")
        ax.set_title(f"{name} ({len(aucs['flat'])} seeds)")
        ax.legend(loc="lower left", fontsize=7)
    fig.suptitle(caption, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
