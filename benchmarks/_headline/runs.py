"""One strategy's run of a headline row, each on a fresh emulated cluster.

A run goes through ``lightning_embark.harness.run_benchmark`` (the ``embark-bench``
machinery) with one strategy, so that every run starts from the same clean cluster and a
crash loses one run only. ``unshaped`` runs the same hosts with their inter-host links
unshaped: the step with no link cost, the other half of an exposed-communication pair
(:mod:`~_headline.paired`). Its record is slimmed for the suite's JSON (the plan condensed
to a count per layout) and tagged with what it crossed: the link rate, the cluster mode,
the dense all-reduce's blocked time and, for a tower row, the towers its plan has.
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
    """What every measured run of the suite shares.

    Attributes:
        steps: Measured steps per run.
        warmup: Unmeasured steps before them.
        allow: The compressions the compressed rows' automatic plans may use.
        dense_compression: Every run's dense-gradient wire format.
        loopback: No emulation: every rank on plain loopback (nothing shaped).
        seed: Data and model seed.
        pipeline: Every run through its strategy's input pipeline (what users run).
        exposed: Every run is a pair, shaped and unshaped, whose difference is its exposed
            communication (:func:`~_headline.paired.run_pair`).
        tower_compression: The tower rows' tower outputs' wire format.
        dense_exchange: How every run's dense gradients cross ranks (``flat``: one
            all-reduce over all ranks, ``hierarchical``: embark's host-aware one, for
            torchrec's DDP too); None: each strategy's own.
    """

    steps: int
    warmup: int
    allow: tuple[str, ...]
    dense_compression: str
    loopback: bool
    seed: int
    pipeline: bool = True
    exposed: bool = True
    tower_compression: str = "fp32"
    dense_exchange: str | None = None


def run_one(
    workload: Workload,
    model: str,
    label: str,
    *,
    rate_mbit: float | None,
    settings: RunSettings,
    steps: int | None = None,
    warmup: int | None = None,
    unshaped: bool = False,
) -> dict[str, Any]:
    """One strategy's run on a fresh emulated cluster (``run_benchmark`` with one strategy),
    its ``runs[0]`` relabelled, with the rate it crossed (None when ``unshaped``: no link
    cost), the cluster mode, the dense all-reduce's blocked ms (from the rank records) and,
    for a tower row, :func:`tower_use`."""
    from lightning_embark.harness import BenchConfig, run_benchmark

    spec = STRATEGY_RUNS[label]
    strategy = spec.strategy
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
        allow=settings.allow if spec.compressed else (),
        dense_compression=settings.dense_compression,
        dense_exchange=settings.dense_exchange,
        interaction=workload.dense["interaction"],
        dense_arch=workload.dense["dense_arch"],
        over_arch=workload.dense["over_arch"],
        pipeline=settings.pipeline,
        unshaped=unshaped,
        tower_compression=settings.tower_compression,
        towers=spec.towers or "auto",  # BenchConfig's default; read by tower runs only
    )
    with tempfile.TemporaryDirectory(prefix="headline-") as tmp:
        result = run_benchmark(config, work_dir=Path(tmp))
        # run_benchmark's folder for the run: its label (``embark-towers:identity`` for a
        # tower run), ``:`` as ``-``, and ``-unshaped`` on the unshaped link.
        ((bench_label, _strategy),) = config.runs()
        folder = bench_label.replace(":", "-") + ("-unshaped" if unshaped else "")
        records = _rank_records(Path(tmp) / folder)
    (run,) = result["runs"]
    plan = run.pop("plan", None)  # the whole plan: large; the condensed summary says what it was
    if spec.towers is not None:
        run["towers"] = tower_use(plan)
    if "plan_summary" in run:
        run["plan_summary"] = condense_plan_summary(run["plan_summary"])
    run["strategy"] = label
    run["rate_mbit"] = result["config"]["rate_mbit"]
    run["cluster_mode"] = result["config"]["cluster"]["mode"]
    run["spec"] = result["config"]["spec"]
    run["dense_blocked_ms"] = _dense_blocked_ms(records, config.warmup)
    return run


def tower_use(plan: dict[str, Any] | None) -> dict[str, Any]:
    """Which towers a run's plan (``Plan.to_dict``) has: with ``towers="auto"`` the planner
    may choose none, and a tower row that ran flat must say so rather than pass for towers.

    ``count``: towers in the plan (0: flat); ``modules``: their modules; ``tables``: tables
    inside towers; ``choice`` and ``reason``: the planner's comparison, where the plan
    records one (``tower_choice``); ``known``: False when the run left no plan to read.
    """
    if plan is None:
        return {"known": False, "count": 0, "modules": [], "tables": 0}
    towers = plan.get("towers") or []
    out: dict[str, Any] = {
        "known": True,
        "count": len(towers),
        "modules": sorted({str(t.get("module", "?")) for t in towers}),
        "tables": sum(len(t.get("tables", ())) for t in towers),
    }
    choice = plan.get("tower_choice")
    if isinstance(choice, dict):
        out["choice"] = choice.get("chosen")
        out["reason"] = choice.get("reason")
    return out


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
