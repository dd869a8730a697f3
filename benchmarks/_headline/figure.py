"""The headline figure: each strategy's step split into what the link costs and the rest.

One panel per model, one bar per strategy, both parts measured: the unshaped step (the
same hosts with no link cost: compute, the engines' CPU, waits for skewed ranks, all that
is not link-bound) and on top the exposed communication (shaped step minus unshaped, per
repeat, :mod:`~_headline.paired`), with its interval as an error bar and the shaped
median step marked. A reader sees which part of a step each strategy shortens: a strategy
can hide more of its exchange and still lose on the CPU, and the figure shows both.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: Stack colours: unshaped step, exposed communication.
STACK_COLORS = ("tab:gray", "tab:blue")

FIGURE_CAPTION = (
    "Bars: the median unshaped step over repeats (the same hosts with the inter-host links "
    "unshaped: compute and everything not link-bound) and, on top, the exposed "
    "communication (shaped minus unshaped step within each repeat: Hodges-Lehmann estimate, "
    "drawn from 0 when negative; error bar: its Wilcoxon interval). Black tick: the median "
    "shaped step. Without exposed pairs (--no-exposed) a bar is the shaped step, hatched."
)


def stack_split(unshaped_ms: float, exposed_ms: float) -> tuple[float, float]:
    """A bar's ``(unshaped, exposed)`` heights in ms: the unshaped step ``U`` and the
    exposed communication ``max(0, E)`` on top. A negative estimate (the link cost less
    than the noise) draws no exposed part; the error bar and the tick still show it."""
    return max(0.0, unshaped_ms), max(0.0, exposed_ms)


def bars(workload: dict[str, Any], labels: Sequence[str]) -> list[dict[str, Any]]:
    """Each strategy's bar for one measured workload: ``unshaped`` and ``exposed`` heights,
    the exposed interval ``low``/``high`` (absolute ms: ``U + low``, ``U + high``),
    ``shaped`` (the median shaped step), or, without exposed pairs, ``shaped`` alone with
    ``measured_exposed`` False."""
    out = []
    for label in labels:
        s = workload["summary"][label]
        shaped = s["step_ms"]["median"]
        if s.get("exposed_ms") is None:
            out.append({"unshaped": shaped, "exposed": 0.0, "shaped": shaped, "measured": False})
            continue
        interval = s["exposed_ms"]["interval"]
        unshaped = s["unshaped_step_ms"]["median"]
        base, top = stack_split(unshaped, interval["estimate"])
        out.append(
            {
                "unshaped": base,
                "exposed": top,
                "low": unshaped + interval["low"],
                "high": unshaped + interval["high"],
                "shaped": shaped,
                "measured": True,
            }
        )
    return out


def plot_headline(workloads: Sequence[dict[str, Any]], labels: Sequence[str], path: Path) -> None:
    """One panel per model (its own y scale: the compute-bound row is ~2-10x longer), one
    bar per strategy: unshaped step, exposed communication on top, interval and tick."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(3.4 * max(1, len(workloads)) + 1, 5.4))
    axes = fig.subplots(1, max(1, len(workloads)), squeeze=False)[0]
    x = range(len(labels))
    for ax, w in zip(axes, workloads, strict=False):
        bs = bars(w, labels)
        hatch = [None if b["measured"] else "//" for b in bs]
        for i, b in enumerate(bs):
            ax.bar(
                i,
                b["unshaped"],
                color=STACK_COLORS[0],
                hatch=hatch[i],
                label="unshaped step" if i == 0 else None,
            )
            if b["measured"]:
                ax.bar(
                    i,
                    b["exposed"],
                    bottom=b["unshaped"],
                    color=STACK_COLORS[1],
                    label="exposed communication" if i == 0 else None,
                )
                ax.errorbar(
                    i,
                    (b["low"] + b["high"]) / 2,
                    yerr=(b["high"] - b["low"]) / 2,
                    color="k",
                    capsize=3,
                    linewidth=0.8,
                )
            ax.plot([i - 0.4, i + 0.4], [b["shaped"]] * 2, color="k", linewidth=1.5)
        rate = "loopback" if w["rate_mbit"] is None else f"{w['rate_mbit']:.4g} Mbit/s"
        ax.set_title(f"{w['title']}\n{rate}, batch {w['batch_size']}/rank", fontsize=9)
        ax.set_xticks(list(x))
        ax.set_xticklabels(labels, rotation=45, ha="right", fontsize=8)
        ax.set_ylabel("step ms")
    axes[0].legend(fontsize=7)
    fig.text(0.01, 0.005, FIGURE_CAPTION, fontsize=6.5, wrap=True, va="bottom")
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.savefig(path, dpi=120)
