"""One headline row measured: its spec, its link rate, then the paired repeats.

The whole of a row's part of ``headline.json``: which spec and rate it ran at and why
(:mod:`~_headline.pilot`), every run of every repeat in the order it ran (each a shaped /
unshaped pair unless ``--no-exposed``, :mod:`~_headline.paired`), and the statistics over
repeats (:mod:`~_headline.summary`). ``runner`` stands in for :func:`run_one` in tests,
where no emulated cluster can start.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .paired import rotated, run_pair, shaped_first
from .pilot import REFERENCE, SHARE_BAND, choose_rate
from .progress import log
from .runs import RunSettings, run_one
from .summary import summarize
from .workloads import Workload, spec_for_bench


def run_repeats(
    workload: Workload,
    model: str,
    labels: Sequence[str],
    *,
    repeats: int,
    rate: float | None,
    settings: RunSettings,
    runner: Callable[..., dict[str, Any]] = run_one,
) -> list[dict[str, dict[str, Any]]]:
    """``repeats`` repeats of every strategy, repeat ``r`` in the order :func:`rotated` by
    ``r``; each run an exposed pair (:func:`run_pair`, shaped first per
    :func:`shaped_first`) when ``settings.exposed``, else the shaped run alone."""
    runs: list[dict[str, dict[str, Any]]] = []
    at = "loopback" if rate is None else f"{rate:.4g} Mbit/s"
    for r in range(repeats):
        order = rotated(labels, r)
        runs_r: dict[str, dict[str, Any]] = {}
        for i, label in enumerate(order, start=1):
            where = f"{workload.key} repeat {r + 1}/{repeats} run {i}/{len(order)}: {label} ({at}"
            run = functools.partial(
                runner, workload, model, label, rate_mbit=rate, settings=settings
            )
            if settings.exposed:
                first = shaped_first(r, labels.index(label))
                log(f"{where}; {'shaped first' if first else 'unshaped first'})")
                runs_r[label] = run_pair(run, first_shaped=first)
            else:
                log(f"{where})")
                runs_r[label] = run()
        runs.append(runs_r)
    return runs


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
    runs = run_repeats(
        workload, model, labels, repeats=repeats, rate=rate, settings=settings, runner=runner
    )
    summary = summarize(runs, labels)
    reference = summary.get(REFERENCE, {}).get("exposed_share")
    low, high = SHARE_BAND
    if reference is not None and workload.pilot and not low <= reference["median"] <= high:
        log(
            f"{workload.key}: {REFERENCE}'s exposed share in the main runs, "
            f"{reference['median']:.0%}, is outside {low:.0%}-{high:.0%}"
        )
    # The rate every shaped run crossed: a loopback fallback (no namespaces) has none.
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
