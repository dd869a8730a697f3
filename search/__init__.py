"""``embark-tune``: an Optuna study that refines the greedy plan from short measured runs.

The greedy planner's choices come from a cost model; the study measures the real thing.
A trial's knobs and per-cluster overrides build a plan through the planner
(:class:`SearchSpace`), the cost model screens it, every rank trains it for a few steps
and the slowest rank's median step is the objective. Trial 0 is the greedy plan; at the
end the best candidates and the greedy plan are re-measured in alternating pairs
(:func:`paired_remeasure`), and only a significant paired gain replaces the greedy plan.

* :func:`tune` runs a study on the emulated cluster (restarting the ranks after a crash
  or hang); :func:`run_ranks` is what every rank runs under any launcher.
* :func:`format_result` prints the outcome.

Docs: docs/architecture.md#the-tuning-study, docs/cli.md#embark-tune.
"""

from lightning_embark.search._config import DEFAULT_STORAGE, TuneConfig
from lightning_embark.search._driver import tune
from lightning_embark.search._measure import FAULT_ENV, Measured, Workload, measure_plan
from lightning_embark.search._paired import PairedCandidate, PairedResult, paired_remeasure
from lightning_embark.search._result import TuneResult, format_result
from lightning_embark.search._session import run_ranks
from lightning_embark.search._space import AUTO, SearchSpace, plan_key
from lightning_embark.search._storage import load_study, open_storage, study_points
from lightning_embark.search._workload import greedy_plan

__all__ = [
    "AUTO",
    "DEFAULT_STORAGE",
    "FAULT_ENV",
    "Measured",
    "PairedCandidate",
    "PairedResult",
    "SearchSpace",
    "TuneConfig",
    "TuneResult",
    "Workload",
    "format_result",
    "greedy_plan",
    "load_study",
    "measure_plan",
    "open_storage",
    "paired_remeasure",
    "plan_key",
    "run_ranks",
    "study_points",
    "tune",
]
