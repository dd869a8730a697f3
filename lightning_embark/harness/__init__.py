"""Running strategies side by side on one (emulated) cluster: the library under ``embark-bench``.

:func:`run_benchmark` launches one job per strategy on the same model, data and hosts
(the per-rank program is :mod:`._worker`) and returns their records; :func:`format_table`
prints them against the first strategy.
"""

from lightning_embark.harness._report import format_table, load_rank_records, summarize_run
from lightning_embark.harness._runner import KNOWN_STRATEGIES, BenchConfig, run_benchmark
from lightning_embark.harness._worker import bench_data, bench_model, bench_trainer

__all__ = [
    "KNOWN_STRATEGIES",
    "BenchConfig",
    "bench_data",
    "bench_model",
    "bench_trainer",
    "format_table",
    "load_rank_records",
    "run_benchmark",
    "summarize_run",
]
