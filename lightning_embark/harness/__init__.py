"""Running strategies side by side on one (emulated) cluster: the library under ``embark-bench``.

:func:`run_benchmark` launches one job per strategy on the same model, data and hosts
(the per-rank program is :mod:`._worker`, which reads its run as a :class:`RankJob`) and
returns their records; :func:`format_table` prints them against the first strategy; with
``profile``, :func:`format_profile_table` prints each embark cluster's exchanges per phase
against the link rate, and
:func:`format_dispatch_run` what a GPU would see of one step of every run (:mod:`._profile`);
:func:`ratio_interval` puts an interval on paired ratios over repeats (:mod:`._stats`).
"""

from lightning_embark.harness._config import KNOWN_STRATEGIES, BenchConfig, RankJob
from lightning_embark.harness._profile import (
    efficiency,
    format_dispatch_run,
    format_profile_table,
    label_cluster_phases,
    link_bytes,
    summarize_profile,
)
from lightning_embark.harness._report import format_table, load_rank_records, summarize_run
from lightning_embark.harness._runner import rank_job_argv, run_benchmark
from lightning_embark.harness._stats import (
    Interval,
    format_interval,
    ratio_interval,
    wilcoxon_interval,
)
from lightning_embark.harness._training import bench_data, bench_model, bench_trainer

__all__ = [
    "KNOWN_STRATEGIES",
    "BenchConfig",
    "Interval",
    "RankJob",
    "bench_data",
    "bench_model",
    "bench_trainer",
    "efficiency",
    "format_dispatch_run",
    "format_interval",
    "format_profile_table",
    "format_table",
    "label_cluster_phases",
    "link_bytes",
    "load_rank_records",
    "rank_job_argv",
    "ratio_interval",
    "run_benchmark",
    "summarize_profile",
    "summarize_run",
    "wilcoxon_interval",
]
