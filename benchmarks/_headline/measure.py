"""One headline row measured: its spec, its link rate, then the paired repeats.

The whole of a row's part of ``headline.json``: which spec and rate it ran at and why
(:mod:`~_headline.pilot`), every run of every repeat in the order it ran, and the summary
over repeats (:mod:`~_headline.paired`). ``runner`` stands in for :func:`run_one` in tests,
where no emulated cluster can start.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .paired import aggregate, rotated
from .pilot import SHARE_BAND, choose_rate
from .progress import log
from .runs import RunSettings, run_one
from .workloads import Workload, spec_for_bench


def measure_workload(
    workload: Workload,
    labels: Sequence[str],
    *,
    repeats: int,
    rate_override: float | None,
    start_rate: float,
    pilot_steps: int,
    pilot_warmup: int,
    target: float,
    settings: RunSettings,
    spec_dir: Path,
    runner: Callable[..., dict[str, Any]] = run_one,
) -> dict[str, Any]:
    """Pilot (if any), then ``repeats`` alternating paired repeats of every strategy."""
    model, width = spec_for_bench(workload, spec_dir)
    rate, source, pilot = choose_rate(
        workload,
        model,
        override=rate_override,
        start_rate=start_rate,
        pilot_steps=pilot_steps,
        pilot_warmup=pilot_warmup,
        target=target,
        settings=settings,
        runner=runner,
    )
    runs: list[dict[str, dict[str, Any]]] = []
    for r in range(repeats):
        order = rotated(labels, r)
        runs_r: dict[str, dict[str, Any]] = {}
        for i, label in enumerate(order, start=1):
            at = "loopback" if rate is None else f"{rate:.4g} Mbit/s"
            log(f"{workload.key} repeat {r + 1}/{repeats} run {i}/{len(order)}: {label} ({at})")
            runs_r[label] = runner(workload, model, label, rate_mbit=rate, settings=settings)
        runs.append(runs_r)
    summary = aggregate(runs, labels)
    if "torchrec-twrw" in summary:
        share = summary["torchrec-twrw"]["comm_share"]
        low, high = SHARE_BAND
        if rate is not None and workload.pilot and not low <= share <= high:
            log(f"{workload.key}: torchrec-twrw's measured share {share:.0%} is outside 25-50%")
    # The rate every run crossed: a loopback fallback (no namespaces) has none.
    applied = {run["rate_mbit"] for rep in runs for run in rep.values()}
    if applied != {rate}:
        log(
            f"{workload.key}: runs crossed {sorted(map(str, applied))}, not {rate}; reporting that"
        )
        rate = applied.pop() if len(applied) == 1 else None
    return {
        "key": workload.key,
        "model": workload.model,
        "bench_model": model,
        "title": workload.title,
        "regime": workload.regime,
        "max_rows": workload.max_rows,
        "width": width,
        "batch_size": workload.batch_size,
        "dense": dict(workload.dense),
        "rate_mbit": rate,
        "rate_source": source,
        "pilot": pilot,
        "order": [rotated(labels, r) for r in range(repeats)],
        "repeats": runs,
        "summary": summary,
    }
