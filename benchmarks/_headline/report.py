"""``headline.md``: the suite's markdown report, its tables and what each column means.

The same text goes to stdout and into ``docs/headline.md``; the report names the command,
date and commit it came from, so that a reader can tell which code made the numbers, and
says how each figure was measured next to it, so that a table read alone is not misread.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .figure import FIGURE_CAPTION
from .pilot import REFERENCE, SHARE_BAND
from .runs import RunSettings
from .summary import BASELINES
from .tables import (
    MIN_REPEATS,
    format_estimate_table,
    format_ratio_table,
    format_time_table,
    format_workloads_table,
)


def method_text(settings: RunSettings, repeats: int, target: float) -> str:
    """The measured tables' method paragraph: repeats, pairs, statistics, the regime."""
    low, high = SHARE_BAND
    pairs = (
        "Each run is a pair: the strategy on the shaped link and on the same hosts with the "
        "links unshaped, back to back, which first alternating by repeat and strategy; its "
        "exposed communication is the difference of the two median steps. "
        if settings.exposed
        else "Shaped runs only (--no-exposed): no exposed communication measured. "
    )
    pipeline = (
        "every run through its strategy's input pipeline (torchrec's TrainPipelineSparseDist, "
        "embark's IDs a step ahead and its exchanges on the engine's lane)"
        if settings.pipeline
        else "no input pipeline (--no-pipeline)"
    )
    few = (
        f" Fewer than {MIN_REPEATS} repeats: no verdicts, and the intervals are wide."
        if repeats < MIN_REPEATS
        else ""
    )
    return (
        f"{repeats} alternating paired repeats (repeat r runs the strategies rotated by r), "
        f"{settings.warmup} warm-up and {settings.steps} measured steps per run; "
        f"{pipeline}; `embark-compressed` and `embark-towers-compressed` allow "
        f"{','.join(settings.allow) or 'nothing'} (towers: the planner's choice, outputs in "
        f"{settings.tower_compression}); every run's dense gradients in "
        f"{settings.dense_compression}"
        + (
            f", exchanged {settings.dense_exchange} by every strategy. "
            if settings.dense_exchange
            else " (each strategy's own exchange, the `dense wire` column). "
        )
        + f"{pairs}"
        "A run's step is its median over measured steps (the slowest rank's, timed end to "
        "end). `x B`: the ratio to baseline B within each repeat, as `estimate [low, high]`: "
        "the Hodges-Lehmann estimate of the paired log ratios and their exact Wilcoxon "
        "signed-rank 95% interval (the achieved level in brackets where it is below 95%: 5 "
        "repeats reach at most 93.75%, 6 reach 96.9%); the plain medians are in the JSON. "
        f"Verdict: against the row's reference, `faster` only when the interval's upper bound "
        f"is below 1 (on at least {MIN_REPEATS} repeats). Comm-bound rows: light dense part, "
        f"link rate from a pilot so that {REFERENCE} (pipelined) has {target:.0%} of its step "
        f"exposed ({low:.0%}-{high:.0%} accepted; the rate column says whether the pilot "
        "landed, the last column what the main runs measured)." + few
    )


def time_text() -> str:
    """What the where-the-time-goes table's columns mean."""
    return (
        "Unshaped step: median over repeats of the unshaped run's median step, and its paired "
        f"ratio to {REFERENCE}'s unshaped step: the comparison with no link cost. Exposed ms: "
        "shaped minus unshaped step within each repeat, Hodges-Lehmann estimate with its "
        "Wilcoxon interval; exposed share: that over the shaped step, median over repeats. "
        "Counter share: the strategy's own counter, the median share of a step blocked in "
        "embedding all-to-alls (it sees only the collectives it labels). CPU ms / rank: CPU "
        "per step per rank, every thread, median. p90/p10: each run's 90th over 10th "
        "percentile step, median over repeats. MB/step: inter-host, summed over ranks; dense "
        "wire: the dense gradients' format and exchange (one all-reduce over all ranks, or "
        "embark's host-aware one)."
    )


def render_markdown(
    *,
    command: str,
    date: str,
    commit: str | None,
    measured: Sequence[dict[str, Any]],
    estimates: Sequence[dict[str, Any]],
    labels: Sequence[str],
    settings: RunSettings,
    repeats: int,
    target: float,
    topology: str,
    torchrec_timeout: int | None,
) -> str:
    """``headline.md``: the command and date, then the workloads, the ratio table, the
    where-the-time-goes table, the figure and the estimate table, each with its method."""
    parts = [
        "# EMBark headline suite",
        "",
        f"`python benchmarks/{command}`" if not command.startswith("python") else f"`{command}`",
        "",
        f"{date}" + (f", commit {commit}" if commit else ""),
        "",
    ]
    baselines = [b for b in BASELINES if b in labels]
    if measured:
        parts += [
            "## Measured: emulated 2 hosts x 2 ranks",
            "",
            format_workloads_table(measured),
            "",
            method_text(settings, repeats, target),
            "",
            format_ratio_table(measured, labels, baselines, pipeline=settings.pipeline),
            "",
            "### Where the time goes",
            "",
            time_text(),
            "",
            format_time_table(measured, labels, pipeline=settings.pipeline),
            "",
            "![headline](headline.png)",
            "",
            FIGURE_CAPTION,
            "",
        ]
    if estimates:
        first = estimates[0]
        budget = "no limit" if torchrec_timeout is None else f"{torchrec_timeout} s"
        parts += [
            f"## Estimate: `{topology}` at scale (cost model, not measured)",
            "",
            f"Batch {first['batch_size']} per rank; the calibrated cost model's step estimate "
            "of the embedding part only (lookups, codecs, exchanges, DP all-reduce; no dense "
            "compute or dense all-reduce). torchrec-twrw: torchrec's planner limited to "
            "table-row-wise; torchrec: its default planner, given "
            f"{budget} per search to finish (the note says whether it finished or was cut); "
            "torchrec-fp16: torchrec's plan with fp16 wires; embark: the greedy plan. Towers "
            "are not estimated here. The original specs (T180's mixed widths kept).",
            "",
            format_estimate_table(estimates, labels),
            "",
        ]
    return "\n".join(parts)
