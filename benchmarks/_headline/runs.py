"""One strategy's run of a headline row, each on a fresh emulated cluster.

A run goes through ``lightning_embark.harness.run_benchmark`` (the ``embark-bench``
machinery) with one strategy, so that every run starts from the same clean cluster and a
crash loses one run only. Its record is slimmed for the suite's JSON (the plan condensed to
a count per layout) and tagged with what it crossed: the link rate, the cluster mode and
the dense all-reduce's blocked time.
"""

from __future__ import annotations

import re
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .workloads import STRATEGY_RUNS, Workload


@dataclass(frozen=True, kw_only=True)
class RunSettings:
    """What every measured run of the suite shares."""

    steps: int
    warmup: int
    allow: tuple[str, ...]
    dense_compression: str
    loopback: bool
    seed: int
    pipeline: bool = True


def run_one(
    workload: Workload,
    model: str,
    label: str,
    *,
    rate_mbit: float | None,
    settings: RunSettings,
    steps: int | None = None,
    warmup: int | None = None,
) -> dict[str, Any]:
    """One strategy's run on a fresh emulated cluster (``run_benchmark`` with one strategy),
    its ``runs[0]`` relabelled, with the rate it crossed, the cluster mode and the dense
    all-reduce's blocked ms (from the rank records)."""
    from lightning_embark.harness import BenchConfig, run_benchmark

    strategy, compressed = STRATEGY_RUNS[label]
    config = BenchConfig(
        model=model,
        max_rows=workload.max_rows,
        batch_size=workload.batch_size,
        steps=steps or settings.steps,
        warmup=settings.warmup if warmup is None else warmup,
        strategies=(strategy,),
        rate_mbit=rate_mbit,
        seed=settings.seed,
        loopback=settings.loopback,
        allow=settings.allow if compressed else (),
        dense_compression=settings.dense_compression,
        interaction=workload.dense["interaction"],
        dense_arch=workload.dense["dense_arch"],
        over_arch=workload.dense["over_arch"],
        pipeline=settings.pipeline,
    )
    with tempfile.TemporaryDirectory(prefix="headline-") as tmp:
        result = run_benchmark(config, work_dir=Path(tmp))
        records = _rank_records(Path(tmp) / strategy)
    (run,) = result["runs"]
    run.pop("plan", None)  # the whole plan: large; the condensed summary says what it was
    if "plan_summary" in run:
        run["plan_summary"] = condense_plan_summary(run["plan_summary"])
    run["strategy"] = label
    run["rate_mbit"] = result["config"]["rate_mbit"]
    run["cluster_mode"] = result["config"]["cluster"]["mode"]
    run["spec"] = result["config"]["spec"]
    run["dense_blocked_ms"] = _dense_blocked_ms(records, config.warmup)
    return run


def _rank_records(folder: Path) -> list[dict[str, Any]]:
    from lightning_embark.errors import EmbarkError
    from lightning_embark.harness import load_rank_records

    try:  # a missing side figure must not lose the run
        return load_rank_records(folder)
    except (EmbarkError, OSError, ValueError):
        return []


def _dense_blocked_ms(records: list[dict[str, Any]], warmup: int) -> float | None:
    """Median over measured steps of the slowest rank's ms blocked in ``dense``-labelled
    collectives. Not the dense exchange's exposed time: DDP's all-reduce (torchrec) waits in
    C++, unseen, and embark's host-aware one blocks a background thread during backward;
    kept in the JSON as a side figure."""
    if not records:
        return None
    steps = min(len(r["comm"]) for r in records)
    values = [
        max(
            r["comm"][i].get("by_traffic", {}).get("dense", {}).get("blocked_seconds", 0.0)
            for r in records
        )
        for i in range(warmup, steps)
    ]
    return 1e3 * statistics.median(values) if values else None


def condense_plan_summary(text: str) -> list[str]:
    """A plan summary's header lines plus, instead of one line per table, a count per
    layout (``table_row_wise (fused) x 177``): hundreds of tables per run would swamp the
    JSON. A table line is indented, ``name: layout ranks=...``; its ranks are dropped."""
    headers: list[str] = []
    counts: dict[str, int] = {}
    for line in text.splitlines():
        if line.startswith((" ", "\t")) and ": " in line:
            layout = re.sub(r"\s*ranks=.*$", "", line.split(": ", 1)[1]).strip()
            counts[layout] = counts.get(layout, 0) + 1
        elif line.strip():
            headers.append(line.strip())
    return headers + [f"{layout} x {n}" for layout, n in counts.items()]
