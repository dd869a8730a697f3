"""The measured tables of ``headline.md``: every ratio with its interval, and a verdict only
where the interval allows one.

A ratio prints as ``estimate [low, high]`` (``format_interval``: the Hodges-Lehmann
estimate of the paired ratios and their Wilcoxon interval, the achieved level added when
it is not ~95%). "faster" is claimed only when the interval's upper bound is below 1, on
at least :data:`MIN_REPEATS` repeats; the plain medians are in the JSON.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .pilot import REFERENCE
from .workloads import REFERENCES

#: The fewest repeats a verdict rests on (the headline suite runs at least 5).
MIN_REPEATS = 5


def interval_text(stats: dict[str, Any] | None, digits: int = 2) -> str:
    """``0.83 [0.78, 0.90]`` of a :func:`~_headline.summary.ratio_stats` (or difference)
    entry, blank where there is none; the achieved level added whenever it is below 95%
    (``format_interval`` names it only beyond 2 points off, and 5 repeats' 93.75% must
    not pass for a 95% interval)."""
    if stats is None:
        return ""
    from lightning_embark.harness import Interval, format_interval

    interval = Interval(**stats["interval"])
    text = format_interval(interval, digits)
    if interval.confidence < 0.95 and not text.endswith(")"):
        text += f" ({interval.confidence:.1%})"
    return text


def verdict(stats: dict[str, Any] | None, reference: str) -> str:
    """The claim a paired ratio against ``reference`` supports: ``faster`` when its
    interval's upper bound is below 1, ``slower`` when its lower bound is above 1, else
    ``not separated``; none on fewer than :data:`MIN_REPEATS` repeats. The level is named
    when it is below 95% (5 repeats reach 93.75%)."""
    if stats is None:
        return ""
    interval = stats["interval"]
    if interval["n"] < MIN_REPEATS:
        return f"none ({interval['n']} repeat(s))"
    if interval["high"] < 1:
        claim = f"faster than {reference}"
    elif interval["low"] > 1:
        claim = f"slower than {reference}"
    else:
        return f"not separated from {reference}"
    level = interval["confidence"]
    return claim + (f" (at {level:.1%})" if level < 0.95 else "")


def strategy_cell(label: str, summary: dict[str, Any], *, pipeline: bool = True) -> str:
    """The row label, with what the row actually ran where it is not what its name says:
    for a tower row, towers chosen in every repeat, in some, or none (a flat plan: the
    planner found no towers cheaper); for any row asked for its input pipeline
    (``pipeline``), a run that trained without one (embark's towers have no input
    distribution to run ahead)."""
    notes = []
    towers = summary.get("towers")
    if towers is not None:
        counts = towers["per_repeat"]
        modules = ",".join(towers["modules"])
        used = sum(1 for c in counts if c)
        if not towers["known"]:
            notes.append("towers unknown: no plan recorded")
        elif not towers["any"]:
            notes.append("no towers chosen: flat")
        elif towers["all"] and len(set(counts)) == 1:
            notes.append(f"{counts[0]} {modules} towers")
        else:
            notes.append(f"{modules} towers in {used}/{len(counts)} repeats")
    if pipeline and "False" in str(summary.get("pipelined", "")).split("/"):
        notes.append("no input pipeline")
    return label if not notes else f"{label} ({'; '.join(notes)})"


def _rate(workload: dict[str, Any]) -> str:
    return "-" if workload["rate_mbit"] is None else f"{workload['rate_mbit']:.4g}"


def format_workloads_table(workloads: Sequence[dict[str, Any]]) -> str:
    """Markdown: each model row's spec, batch, dense part, link rate and where it came
    from, and the reference's exposed share in the main runs (the regime it defines)."""
    lines = [
        "| row | model | regime | rows cap | width | batch / rank | dense part | link Mbit/s "
        f"| rate from | {REFERENCE} exposed (main runs) |",
        "|---|---|---|---:|---|---:|---|---:|---|---:|",
    ]
    for w in workloads:
        dense = w["dense"]
        arch = f"{dense['interaction']}, bottom {dense['dense_arch']}, top {dense['over_arch']}"
        share = w["summary"].get(REFERENCE, {}).get("exposed_share")
        shown = "-" if share is None else f"{share['median']:.0%}"
        lines.append(
            f"| {w['key']} | {w['model']} | {w['regime']} | "
            f"{w['max_rows'] if w['max_rows'] is not None else '-'} | {w['width']} | "
            f"{w['batch_size']} | {arch} | {_rate(w)} | {w['rate_source']} | {shown} |"
        )
    return "\n".join(lines)


def format_ratio_table(
    workloads: Sequence[dict[str, Any]],
    labels: Sequence[str],
    baselines: Sequence[str],
    *,
    pipeline: bool = True,
) -> str:
    """Markdown: per model and strategy, the median step, the paired ratio to each
    baseline with its interval, and the verdict against the row's reference."""
    head = " | ".join(f"x {b}" for b in baselines)
    lines = [
        f"| model | link Mbit/s | strategy | step ms | {head} | verdict |",
        "|---|---:|---|---:|" + "---:|" * len(baselines) + "---|",
    ]
    for w in workloads:
        for label in labels:
            s = w["summary"][label]
            ratios = " | ".join(
                "-" if b == label else interval_text(s["ratio"].get(b)) for b in baselines
            )
            ref = REFERENCES.get(label)
            claim = "" if ref is None else verdict(s["ratio"].get(ref), ref)
            lines.append(
                f"| {w['title']} | {_rate(w)} | {strategy_cell(label, s, pipeline=pipeline)} | "
                f"{s['step_ms']['median']:.1f} | {ratios} | {claim} |"
            )
    return "\n".join(lines)


def format_time_table(
    workloads: Sequence[dict[str, Any]], labels: Sequence[str], *, pipeline: bool = True
) -> str:
    """Markdown: where each strategy's step goes: the unshaped step and its paired ratio to
    the reference, the exposed communication with its interval and share, the strategy's
    own counter share, CPU per rank, within-run spread and inter-host bytes."""
    lines = [
        f"| model | strategy | unshaped step ms | unshaped x {REFERENCE} | exposed ms "
        "| exposed share | counter share | CPU ms / rank | p90/p10 | emb. inter MB/step "
        "| dense inter MB/step | dense wire |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for w in workloads:
        for label in labels:
            s = w["summary"][label]
            unshaped = s.get("unshaped_step_ms")
            ratio = (
                "-"
                if label == REFERENCE
                else interval_text(s.get("unshaped_ratio", {}).get(REFERENCE))
            )
            share = s.get("exposed_share")
            cpu = s.get("cpu_ms_per_rank")
            lines.append(
                f"| {w['title']} | {strategy_cell(label, s, pipeline=pipeline)} | "
                f"{'' if unshaped is None else format(unshaped['median'], '.1f')} | {ratio} | "
                f"{interval_text(s.get('exposed_ms'), 0)} | "
                f"{'' if share is None else format(share['median'], '.0%')} | "
                f"{s['comm_share']:.0%} | {'' if cpu is None else format(cpu, '.0f')} | "
                f"{s['spread']['median']:.2f} | {s['embedding_inter_mb']:.2f} | "
                f"{s['dense_inter_mb']:.2f} | {s['dense_compression']} {s['dense_exchange']} |"
            )
    return "\n".join(lines)


def format_estimate_table(rows: Sequence[dict[str, Any]], labels: Sequence[str]) -> str:
    """Markdown: the cost model's estimated step per model, cluster and strategy, with
    whether torchrec's search finished (the note)."""
    lines = [
        "| model | cluster | strategy | estimate ms | x twrw | x fp16 | note |",
        "|---|---|---|---:|---:|---:|---|",
    ]
    for row in rows:
        est = row["strategies"]
        for label in labels:
            if label not in est:
                continue
            ms = est[label]["step_ms"]
            twrw = est.get("torchrec-twrw", {}).get("step_ms")
            fp16 = est.get("torchrec-fp16", {}).get("step_ms")
            x_twrw = f"{ms / twrw:.2f}" if twrw else ""
            x_fp16 = f"{ms / fp16:.2f}" if fp16 else ""
            lines.append(
                f"| {row['model']} | {row['hosts']} x {row['ranks_per_host']} | {label} | "
                f"{ms:.2f} | {x_twrw} | {x_fp16} | {est[label].get('note', '')} |"
            )
    return "\n".join(lines)
