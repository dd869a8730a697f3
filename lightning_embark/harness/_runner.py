"""Running strategies side by side on one emulated cluster: the library behind ``embark-bench``.

Each run is announced on stderr (``[embark-bench] strategy 2/3: embark``) and shows rank 0's
progress bar (:mod:`._progress`); the result records the link the runs crossed and the
machine they ran on, since a step time means little without either.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import platform
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning_embark.harness._report as report
import lightning_embark.harness._worker as worker
from lightning_embark.errors import EmbarkError
from lightning_embark.harness._config import BenchConfig, RankJob


def run_benchmark(config: BenchConfig, *, work_dir: Path | None = None) -> dict[str, Any]:
    """Run every strategy on one emulated cluster and return the result JSON.

    Raises:
        EmbarkError: a strategy's job failed (its logs were streamed above).
    """
    from lightning_embark.emulation import EmulatedHosts, EmulationConfig

    link: dict[str, Any] = {"rate_mbit": config.rate_mbit} if config.rate_mbit is not None else {}
    cluster_config = EmulationConfig(
        num_hosts=config.num_hosts,
        ranks_per_host=config.ranks_per_host,
        delay_ms=config.delay_ms,
        **link,
    )
    runs: list[dict[str, Any]] = []
    planned = config.runs()
    with tempfile.TemporaryDirectory(prefix="embark-bench-") as tmp:
        root = Path(work_dir or tmp)
        with EmulatedHosts(cluster_config, force_loopback=config.loopback) as cluster:
            cluster.set_shaped(not config.unshaped)
            print(f"[embark-bench] {cluster.describe()}", file=sys.stderr, flush=True)
            for index, (label, strategy) in enumerate(planned, start=1):
                position = f"{index}/{len(planned)}"
                links = [not config.unshaped]
                if config.exposed:  # both links, back to back, alternating which goes first
                    links = [True, False] if index % 2 else [False, True]
                measured: dict[bool, dict[str, Any]] = {}
                for shaped in links:
                    cluster.set_shaped(shaped)
                    suffix = "" if not config.exposed else " (shaped)" if shaped else " (unshaped)"
                    print(
                        f"[embark-bench] strategy {position}: {label}{suffix}",
                        file=sys.stderr,
                        flush=True,
                    )
                    out_dir = root / (label.replace(":", "-") + ("" if shaped else "-unshaped"))
                    measured[shaped] = _run_one(
                        config, cluster, label, strategy, out_dir, position
                    )
                run = measured[links[0]] if not config.exposed else measured[True]
                if config.exposed:
                    run |= exposed_fields(run, measured[False])
                runs.append(run)
            cluster.set_shaped(not config.unshaped)
            rate, rate_source = applied_rate(config, cluster.mode, cluster.config.rate_mbit)
            cluster_info = {
                "mode": cluster.mode,
                "description": cluster.describe(),
                "rate_source": rate_source,
            }
    return {
        "config": dataclasses.asdict(config)
        | {
            "rate_mbit": rate,
            "cluster": cluster_info,
            "machine": machine_info(),
            "spec": runs[0]["spec"],
        },
        "runs": runs,
    }


def rank_job_argv(
    config: BenchConfig,
    strategy: str,
    out_dir: Path,
    label: str | None = None,
    position: str | None = None,
) -> list[str]:
    """The worker's command line for one run: the run's :class:`~._config.RankJob` is
    written to ``out_dir/job.json``, and the worker is given that file only."""
    job = RankJob(
        config=config, strategy=strategy, label=label, position=position, out_dir=out_dir
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    job_file = out_dir / "job.json"
    job_file.write_text(job.to_json())
    return [str(Path(worker.__file__).resolve()), str(job_file)]


def _run_one(
    config: BenchConfig,
    cluster: Any,
    label: str,
    strategy: str,
    out_dir: Path,
    position: str,
) -> dict[str, Any]:
    """One strategy's job on ``cluster`` as it is now (shaped or not), summarised.

    Raises:
        EmbarkError: the job failed (its logs were streamed above).
    """
    from lightning_embark.emulation import QUIET_RANK_ENV

    job = RankJob(
        config=config, strategy=strategy, label=label, position=position, out_dir=out_dir
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    job_file = out_dir / "job.json"
    job_file.write_text(job.to_json())
    with _progress_in_place():
        code = cluster.run(
            [str(Path(worker.__file__).resolve()), str(job_file)], env=QUIET_RANK_ENV
        )
    if code != 0:
        raise EmbarkError(f"strategy {label!r} failed with exit code {code}; see the logs above")
    records = report.load_rank_records(out_dir)
    run = report.summarize_run(label, records, warmup=config.warmup)
    run["link"] = "shaped" if cluster.mode == "netns" and cluster.shaped else "unshaped"
    run["spec"] = records[0]["spec"]
    if config.val_batches:
        run["validation"] = records[0].get("validation", {})
    if "plan" in records[0]:
        run["plan"] = records[0]["plan"]
    if config.profile and strategy.startswith("embark"):
        run["profile"] = _profile(config, records, cluster.mode, cluster.config)
    if config.profile:
        from lightning_embark.harness._profile import summarize_dispatch

        run["dispatch"] = summarize_dispatch(records)
    return run


def exposed_fields(shaped: dict[str, Any], unshaped: dict[str, Any]) -> dict[str, Any]:
    """What the link cost a run: its median step on the shaped link minus the same step's
    on the unshaped one (``exposed_ms``), that over the shaped step (``exposed_share``),
    and the unshaped run's own figures."""
    on, off = shaped["step_time_ms"]["median"], unshaped["step_time_ms"]["median"]
    return {
        "unshaped": {
            "step_time_ms": unshaped["step_time_ms"],
            "cpu_ms_per_rank": unshaped.get("cpu_ms_per_rank"),
            "comm_share": unshaped["comm_share"],
        },
        "exposed_ms": on - off,
        "exposed_share": (on - off) / on if on > 0 else 0.0,
    }


def _profile(
    config: BenchConfig, records: list[dict[str, Any]], mode: str, cluster: Any
) -> list[dict[str, Any]]:
    """A profiled run's per-cluster, per-phase exchanges against the applied link rate."""
    from lightning_embark.harness._profile import summarize_profile

    num_steps = min(len(r["step_seconds"]) for r in records)
    rate, _ = applied_rate(config, mode, cluster.rate_mbit)
    return summarize_profile(
        records,
        range(config.warmup, num_steps),
        ranks_per_host=cluster.ranks_per_host,
        rate_mbit=rate,
    )


def applied_rate(
    config: BenchConfig, mode: str, cluster_rate: float | None
) -> tuple[float | None, str]:
    """The inter-host rate the runs crossed, in Mbit/s, and where it came from.

    Shaped links (``netns`` mode) have a rate: ``--rate-mbit``'s or the emulation's
    default, which ``tc`` applied. On loopback (``--loopback``, or the fallback when no
    namespace could be created) nothing is shaped and there is no rate: None.
    """
    if mode != "netns":
        reason = "--loopback" if config.loopback else "namespaces could not be created"
        return None, f"none: loopback ({reason}), not emulated, no shaped link"
    if config.unshaped:
        return None, "none: unshaped veths (--unshaped)"
    assert cluster_rate is not None, "the bench always shapes its emulated links"
    return float(cluster_rate), "--rate-mbit" if config.rate_mbit is not None else "default"


def machine_info() -> dict[str, Any]:
    """What the runs ran on: CPU model, cores, and the versions that shape a step time."""
    import torch

    model = None
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "cpu model"):
                model = value.strip()
                break
    affinity = getattr(os, "sched_getaffinity", None)  # Linux only
    usable = len(affinity(0)) if affinity is not None else os.cpu_count()
    return {
        "cpu_model": model or platform.processor() or None,
        "cpu_count": os.cpu_count(),
        "cpus_usable": usable,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


@contextlib.contextmanager
def _progress_in_place() -> Iterator[None]:
    """On a terminal, ``sys.stdout`` redraws rank 0's progress lines over each other while
    the block runs (:class:`~._progress.InPlaceProgress`); elsewhere (a log, a pipe, a
    test's capture) they stay lines."""
    from lightning_embark.harness._progress import InPlaceProgress

    if not sys.stdout.isatty():
        yield
        return
    stream = InPlaceProgress(sys.stdout)
    try:
        with contextlib.redirect_stdout(stream):
            yield
    finally:
        stream.end_line()  # before the bench or a failing host prints anything
        stream.flush()
