"""``headline.md``: the suite's markdown report, its tables and what each column means.

The same tables go to stdout and into ``docs/headline.md``; the report names the command,
date and commit it came from, so that a reader can tell which code made the numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .figure import FIGURE_CAPTION
from .runs import RunSettings


def _fmt_ratio(summary: dict[str, Any], base: str) -> str:
    """A row's median paired ratio to ``base``, blank where ``base`` did not run."""
    ratio = summary["ratio"].get(base)
    return "" if ratio is None else f"{ratio['median']:.2f}"


def format_workloads_table(workloads: Sequence[dict[str, Any]]) -> str:
    """Markdown: each model row's spec, batch, dense part and link rate (and its source)."""
    lines = [
        "| row | model | regime | rows cap | width | batch / rank | dense part | link Mbit/s "
        "| rate from |",
        "|---|---|---|---:|---|---:|---|---:|---|",
    ]
    for w in workloads:
        dense = w["dense"]
        arch = f"{dense['interaction']}, bottom {dense['dense_arch']}, top {dense['over_arch']}"
        rate = "-" if w["rate_mbit"] is None else f"{w['rate_mbit']:.4g}"
        lines.append(
            f"| {w['key']} | {w['model']} | {w['regime']} | "
            f"{w['max_rows'] if w['max_rows'] is not None else '-'} | {w['width']} | "
            f"{w['batch_size']} | {arch} | {rate} | {w['rate_source']} |"
        )
    return "\n".join(lines)


def format_measured_table(workloads: Sequence[dict[str, Any]], labels: Sequence[str]) -> str:
    """Markdown: per model and strategy, step time, paired ratios, share and MB/step."""
    lines = [
        "| model | link Mbit/s | strategy | step ms | p10-p90 ms | x twrw | x fp16 "
        "| emb. exchange share | emb. inter MB/step | dense inter MB/step | dense wire |",
        "|---|---:|---|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    for w in workloads:
        rate = "-" if w["rate_mbit"] is None else f"{w['rate_mbit']:.4g}"
        for label in labels:
            s = w["summary"][label]
            step = s["step_ms"]
            lines.append(
                f"| {w['title']} | {rate} | {label} | {step['median']:.1f} | "
                f"{step['p10']:.1f}-{step['p90']:.1f} | {_fmt_ratio(s, 'torchrec-twrw')} | "
                f"{_fmt_ratio(s, 'torchrec-fp16')} | {s['comm_share']:.0%} | "
                f"{s['embedding_inter_mb']:.2f} | {s['dense_inter_mb']:.2f} | "
                f"{s['dense_compression']} {s.get('dense_exchange', '')} |"
            )
    return "\n".join(lines)


def format_estimate_table(rows: Sequence[dict[str, Any]], labels: Sequence[str]) -> str:
    """Markdown: the cost model's estimated step per model, cluster and strategy."""
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
    topology: str,
) -> str:
    """``headline.md``: the command and date, then the workloads, measured and estimate
    tables with what each column means."""
    parts = [
        "# EMBark headline suite",
        "",
        f"`python benchmarks/{command}`" if not command.startswith("python") else f"`{command}`",
        "",
        f"{date}" + (f", commit {commit}" if commit else ""),
        "",
    ]
    if measured:
        shares = [
            f"{w['key']} {w['summary']['torchrec-twrw']['comm_share']:.0%}"
            for w in measured
            if "torchrec-twrw" in w["summary"]
        ]
        parts += [
            "## Measured: emulated 2 hosts x 2 ranks",
            "",
            format_workloads_table(measured),
            "",
            f"{repeats} alternating paired repeats (repeat r runs the strategies rotated by r), "
            f"{settings.warmup} warm-up and {settings.steps} measured steps per run; "
            f"`embark-compressed` allows {','.join(settings.allow) or 'nothing'}; every run's "
            f"dense gradients in {settings.dense_compression} (`dense wire`: format and "
            "exchange, one all-reduce over all ranks or embark's host-aware one); "
            + (
                "every run through its strategy's input pipeline (torchrec's "
                "TrainPipelineSparseDist, embark's IDs a step ahead). "
                if settings.pipeline
                else "no input pipeline (--no-pipeline). "
            )
            + "Step ms: median "
            "over repeats of each run's median step; p10-p90 across the repeats' medians. "
            "`x twrw`, `x fp16`: the ratio to that baseline within each repeat, median over "
            "repeats. Emb. exchange share: median share of a step blocked in embedding "
            "all-to-alls. MB/step: inter-host, summed over ranks. Comm-bound rows: light dense "
            "part, link rate from a pilot so that `torchrec-twrw` would spend ~37.5% of its "
            f"step in embedding exchange; measured in the main runs: {', '.join(shares)}.",
            "",
            format_measured_table(measured, labels),
            "",
            "![headline](headline.png)",
            "",
            FIGURE_CAPTION,
            "",
        ]
    if estimates:
        first = estimates[0]
        parts += [
            f"## Estimate: `{topology}` at scale (cost model, not measured)",
            "",
            f"Batch {first['batch_size']} per rank; the calibrated cost model's step estimate "
            "of the embedding part only (lookups, codecs, exchanges, DP all-reduce; no dense "
            "compute or dense all-reduce). torchrec-twrw: torchrec's planner limited to "
            "table-row-wise; torchrec-fp16: torchrec's plan with fp16 wires; embark: the greedy "
            "plan. The original specs (T180's mixed widths kept).",
            "",
            format_estimate_table(estimates, labels),
            "",
        ]
    return "\n".join(parts)
