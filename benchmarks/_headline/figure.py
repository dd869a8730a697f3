"""The headline figure: each strategy's median step, stacked by where its time goes.

One panel per model, one bar per strategy: compute, embedding exchange (measured share)
and dense exchange (derived from the dense gradients' bytes and the link rate, since the
dense all-reduce's exposed time is not measured), so that a reader sees which part of a
step each strategy shortens.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: Stack colours: compute, embedding exchange, dense exchange.
STACK_COLORS = ("tab:gray", "tab:blue", "tab:orange")

FIGURE_CAPTION = (
    "Median step time over repeats, stacked. Embedding exchange: the measured median share of "
    "a step blocked in embedding all-to-alls, times the step. Dense exchange: derived, not "
    "measured: the dense gradients' inter-host bytes per host over the shaped link rate (wire "
    "time at full rate; DDP and embark's all-reduce overlap it with backward, so the exposed "
    "part may be smaller). Compute: the rest of the step."
)


def dense_wire_ms(dense_inter_bytes: float, *, num_hosts: int, rate_mbit: float | None) -> float:
    """Time the dense gradients' inter-host bytes take on the shaped link, in ms.

    ``dense_inter_bytes`` is summed over ranks (what every rank sends across hosts); each
    host's link carries its own ranks' share, ``bytes / num_hosts`` (hosts are symmetric),
    at ``rate`` Mbit/s per direction::

        t = (bytes / num_hosts) * 8 / (rate * 1e6)[s]

    Unshaped (``rate`` None: loopback) gives 0: there is no link rate to derive it from.
    """
    if rate_mbit is None or rate_mbit <= 0 or num_hosts < 2:
        return 0.0
    return 1e3 * (dense_inter_bytes / num_hosts) * 8 / (rate_mbit * 1e6)


def stack_split(step_ms: float, comm_share: float, dense_ms: float) -> tuple[float, float, float]:
    """A step's ``(compute, embedding exchange, dense exchange)`` ms for the figure.

    Embedding exchange ``E = share * T`` (the measured share of a step blocked in embedding
    all-to-alls); dense exchange ``D = min(dense_ms, T - E)`` (its wire time,
    :func:`dense_wire_ms`, at most what is left); compute ``C = T - E - D``, everything
    else. The three add up to ``T``.
    """
    share = min(1.0, max(0.0, comm_share))
    embedding = share * step_ms
    dense = min(max(0.0, dense_ms), step_ms - embedding)
    return step_ms - embedding - dense, embedding, dense


def stacks(workload: dict[str, Any], labels: Sequence[str]) -> list[tuple[float, float, float]]:
    """Each strategy's :func:`stack_split` for one measured workload."""
    out = []
    for label in labels:
        s = workload["summary"][label]
        dense = dense_wire_ms(
            s["dense_inter_mb"] * 1e6, num_hosts=2, rate_mbit=workload["rate_mbit"]
        )
        out.append(stack_split(s["step_ms"]["median"], s["comm_share"], dense))
    return out


def plot_headline(workloads: Sequence[dict[str, Any]], labels: Sequence[str], path: Path) -> None:
    """One panel per model (its own y scale: the compute-bound row is ~10x longer), one bar
    per strategy stacked compute / embedding exchange / dense exchange."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(3.2 * max(1, len(workloads)) + 1, 5.2))
    axes = fig.subplots(1, max(1, len(workloads)), squeeze=False)[0]
    parts = ("compute", "embedding exchange", "dense exchange (derived)")
    for ax, w in zip(axes, workloads, strict=False):
        bottoms = [0.0] * len(labels)
        for k, (part, color) in enumerate(zip(parts, STACK_COLORS, strict=True)):
            heights = [split[k] for split in stacks(w, labels)]
            ax.bar(range(len(labels)), heights, bottom=bottoms, color=color, label=part)
            bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
        rate = "loopback" if w["rate_mbit"] is None else f"{w['rate_mbit']:.4g} Mbit/s"
        ax.set_title(f"{w['title']}\n{rate}, batch {w['batch_size']}/rank", fontsize=9)
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(labels, rotation=45, ha="right", fontsize=8)
        ax.set_ylabel("step ms")
    axes[0].legend(fontsize=7)
    fig.text(0.01, 0.005, FIGURE_CAPTION, fontsize=6.5, wrap=True, va="bottom")
    fig.tight_layout(rect=(0, 0.09, 1, 1))
    fig.savefig(path, dpi=120)
