"""Aggregating per-rank benchmark records into the ``embark-bench`` JSON and table.

Schema (stable; later strategies add fields, never rename them)::

    {"config": {...},
     "runs": [{"strategy": str,
               "step_time_ms": {"median": float, "p10": float, "p90": float},
               "samples_per_s": float,
               "comm_share": float,
               "bytes_per_step": {"intra_host": int, "inter_host": int,
                                  "embedding_inter_host": int,
                                  "by_collective": {...}, "by_traffic": {...}},
               "peak_rss_mb": float,
               "cpu_ms_per_rank": float | null,
               "link": "shaped" | "unshaped",
               "exposed_ms": float, "exposed_share": float,  # with --exposed
               "unshaped": {"step_time_ms": {...}, "cpu_ms_per_rank": ..., "comm_share": ...},
               "dense_compression": "fp32" | "bf16" | "fp16",
               "dense_exchange": "flat" | "hierarchical", ...}]}

A step's time is the slowest rank's (ranks wait for each other in collectives), from
the end of the step before to its own end, the next batch's fetch included;
``cpu_ms_per_rank`` is the CPU a rank's process used per step, all its threads;
bytes are summed over ranks (what the whole cluster moves per step). ``by_traffic``
splits out labelled parts of the step (``towers:ids``, ``towers:outputs``,
``towers:modules``, ``dense``, ``metrics``); ``embedding_inter_host`` is the inter-host
bytes of everything but the dense gradients and the logged metrics' reductions: the
embedding part, towers included. ``dense_compression`` and ``dense_exchange`` say how
the run's dense gradients crossed ranks (the wire format; one all-reduce over every rank
or embark's host-aware one), the table's ``dense`` column.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lightning_embark.errors import EmbarkError

#: Traffic labels (:mod:`lightning_embark._traffic`) that are not the embedding exchange.
NOT_EMBEDDING = ("dense", "metrics")


def _quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def load_rank_records(folder: Path) -> list[dict[str, Any]]:
    """The ``rank*.json`` files a worker run left in ``folder``, in rank order."""
    records = [json.loads(p.read_text()) for p in sorted(folder.glob("rank*.json"))]
    if not records:
        raise EmbarkError(f"no rank records in {folder}: the benchmark workers wrote nothing")
    return sorted(records, key=lambda r: r["rank"])


def summarize_run(strategy: str, records: list[dict[str, Any]], *, warmup: int) -> dict[str, Any]:
    """One ``runs[]`` entry from every rank's records of one strategy."""
    num_steps = min(len(r["step_seconds"]) for r in records)
    measured = range(warmup, num_steps)
    if len(measured) == 0:
        raise EmbarkError(
            f"{strategy}: {num_steps} steps recorded but warmup is {warmup}; "
            "run more steps or lower --warmup"
        )
    step_seconds = [max(r["step_seconds"][i] for r in records) for i in measured]
    shares = [statistics.fmean(r["embedding_share"][i] for r in records) for i in measured]
    median = statistics.median(step_seconds)
    global_batch = sum(r["batch_size"] for r in records)

    def per_step_total(key: str) -> int:
        return round(sum(statistics.fmean(r["comm"][i][key] for i in measured) for r in records))

    by_collective = _per_step(records, measured, "by_collective")
    by_traffic = _per_step(records, measured, "by_traffic")
    inter = per_step_total("inter_host")
    run = {
        "strategy": strategy,
        "step_time_ms": {
            "median": 1000 * median,
            "p10": 1000 * _quantile(step_seconds, 0.1),
            "p90": 1000 * _quantile(step_seconds, 0.9),
        },
        "samples_per_s": global_batch / median,
        "comm_share": statistics.median(shares),
        "bytes_per_step": {
            "intra_host": per_step_total("intra_host"),
            "inter_host": inter,
            "embedding_inter_host": inter
            - sum(by_traffic.get(label, {}).get("inter_host", 0) for label in NOT_EMBEDDING),
            "by_collective": by_collective,
            "by_traffic": by_traffic,
        },
        "peak_rss_mb": max(r["peak_rss_mb"] for r in records),
        "cpu_ms_per_rank": _cpu_ms(records, measured),
        "num_measured_steps": len(measured),
    }
    engine = _engine_ms(records, measured)
    if engine:
        run["engine_ms"] = engine
    for key in ("plan_summary", "dense_compression", "dense_exchange", "pipelined", "overlapped"):
        if key in records[0]:
            run[key] = records[0][key]
    return run


def _cpu_ms(records: list[dict[str, Any]], measured: range) -> float | None:
    """Median over measured steps of the ranks' mean CPU ms per step (every thread of a
    rank's process); None for records written before ranks recorded it."""
    if not all(r.get("cpu_seconds") for r in records):
        return None
    per_step = [1000 * statistics.fmean(r["cpu_seconds"][i] for r in records) for i in measured]
    return statistics.median(per_step)


def _per_step(
    records: list[dict[str, Any]], measured: range, key: str
) -> dict[str, dict[str, int]]:
    """Bytes and calls per step of each entry of every rank's ``comm[i][key]``, summed
    over ranks (records written before a key existed count as empty)."""
    totals: dict[str, dict[str, int]] = {}
    for r in records:
        for i in measured:
            for name, stats in r["comm"][i].get(key, {}).items():
                entry = totals.setdefault(name, {"intra_host": 0, "inter_host": 0, "calls": 0})
                for field in entry:
                    entry[field] += stats[field]
    scale = len(measured)
    return {n: {k: round(v / scale) for k, v in e.items()} for n, e in sorted(totals.items())}


#: Engine timings an embark run records per step (``EmbarkMetricsCallback``), by report key.
_ENGINE_KEYS = {
    "embedding_forward": "embark/embedding_forward_ms",
    "embedding_backward": "embark/embedding_backward_ms",
}


def _engine_ms(records: list[dict[str, Any]], measured: range) -> dict[str, float]:
    """Median over measured steps of the slowest rank's engine forward/backward ms
    (embark runs only): where a step's embedding time goes, beside the blocked share."""
    if not all(r.get("engine_ms") for r in records):
        return {}
    steps = [i for i in measured if all(i < len(r["engine_ms"]) for r in records)]
    out = {}
    for name, key in _ENGINE_KEYS.items():
        values = [max(r["engine_ms"][i].get(key, 0.0) for r in records) for i in steps]
        if values:
            out[name] = statistics.median(values)
    return out


def format_table(runs: list[dict[str, Any]]) -> str:
    """Side-by-side table; ratios are against the first run."""
    width = max(16, 2 + max(len(run["strategy"]) for run in runs))
    header = (
        f"{'strategy':<{width}}{'step ms':>10}{'x base':>8}{'samples/s':>11}{'CPU ms':>8}"
        f"{'comm share':>11}"
        f"{'intra MB/step':>14}{'inter MB/step':>14}{'x base':>8}{'emb inter MB':>13}"
        f"{'x base':>8}{'peak RSS MB':>12}  {'dense':<10}"
    )
    exposed = all("exposed_ms" in run for run in runs)
    if exposed:
        header += f"{'unshaped ms':>12}{'exposed ms':>11}{'exposed':>8}"
    lines = [header, "-" * len(header)]
    base = runs[0]
    for run in runs:
        step = run["step_time_ms"]["median"]
        inter = run["bytes_per_step"]["inter_host"]
        base_inter = base["bytes_per_step"]["inter_host"]
        inter_ratio = inter / base_inter if base_inter else float("nan")
        emb = _embedding_inter(run)
        emb_ratio = emb / _embedding_inter(base) if _embedding_inter(base) else float("nan")
        lines.append(
            f"{run['strategy']:<{width}}{step:>10.1f}{step / base['step_time_ms']['median']:>8.2f}"
            f"{run['samples_per_s']:>11.0f}{_cpu(run):>8}{run['comm_share']:>11.0%}"
            f"{run['bytes_per_step']['intra_host'] / 1e6:>14.2f}{inter / 1e6:>14.2f}"
            f"{inter_ratio:>8.2f}{emb / 1e6:>13.2f}{emb_ratio:>8.2f}{run['peak_rss_mb']:>12.0f}"
            f"  {_dense(run):<10}"
            + (
                f"{run['unshaped']['step_time_ms']['median']:>12.1f}{run['exposed_ms']:>11.1f}"
                f"{run['exposed_share']:>8.0%}"
                if exposed
                else ""
            )
        )
    return "\n".join(line.rstrip() for line in lines)


def _cpu(run: dict[str, Any]) -> str:
    """A rank's CPU ms per step, ``?`` for results written before runs recorded it."""
    cpu = run.get("cpu_ms_per_rank")
    return "?" if cpu is None else f"{cpu:.1f}"


#: The table's short names of the dense exchanges.
_EXCHANGES = {"flat": "flat", "hierarchical": "hier"}


def _dense(run: dict[str, Any]) -> str:
    """How the run's dense gradients crossed ranks, e.g. ``bf16 hier`` (``?`` for results
    written before runs recorded it)."""
    compression = run.get("dense_compression", "?")
    exchange = run.get("dense_exchange")
    return f"{compression} {_EXCHANGES.get(exchange, exchange)}" if exchange else compression


def _embedding_inter(run: dict[str, Any]) -> int:
    """Inter-host bytes per step of the embedding part (all of it for results written
    before the dense gradients were labelled)."""
    per_step = run["bytes_per_step"]
    return int(per_step.get("embedding_inter_host", per_step["inter_host"]))
