"""Greedy sharding planner with a calibrated, topology-aware cost model.

- :mod:`~lightning_embark.planner._stats`: per-feature hotness and unique ratio
  (``embark-stats``: :mod:`~lightning_embark.cli.embark_stats`).
- :mod:`~lightning_embark.planner._hardware`: hardware constants, presets;
  :mod:`~lightning_embark.planner._optimizer_state` the sparse optimizer's state bytes.
- :mod:`~lightning_embark.calibration._fit`: measuring and fitting them on the cluster
  at hand (``embark-calibrate``: :mod:`~lightning_embark.cli.embark_calibrate`; the
  measurements themselves: :mod:`~lightning_embark.calibration._probes`; the calibration
  built from them: :mod:`~lightning_embark.calibration._from_measurements`).
- :mod:`~lightning_embark.planner._cost`: per-rank step-time and memory estimate, from
  per-table terms (:mod:`~lightning_embark.planner._terms`) and link seconds
  (:mod:`~lightning_embark.planner._links`).
- :mod:`~lightning_embark.planner._greedy`: the EMBark-style greedy planner.
- :mod:`~lightning_embark.planner._towers`: planning with towers (DMT);
  :mod:`~lightning_embark.planner._tower_cost` their cost terms;
  :mod:`~lightning_embark.planner._partition` the tower partitioner, over the feature
  affinity :mod:`~lightning_embark.planner._affinity` measures from a warm-up run;
  :mod:`~lightning_embark.planner._tower_choice` whether towers pay, and which
  (``towers="auto"``).
- :mod:`~lightning_embark.baseline._plan_io`: torchrec ``ShardingPlan`` import/export.
- ``embark-plan``: :mod:`~lightning_embark.cli.embark_plan`.
"""

from lightning_embark.planner._affinity import measure_affinity
from lightning_embark.planner._cost import CostModel, Estimate, RankEstimate, estimate_plan
from lightning_embark.planner._greedy import GreedyPlanner
from lightning_embark.planner._greedy_config import GreedyConfig, Planner, PlanResult
from lightning_embark.planner._hardware import (
    Calibration,
    calibration_for_topology,
    calibration_names,
    load_calibration,
)
from lightning_embark.planner._optimizer_state import (
    DEFAULT_SPARSE_OPTIMIZER,
    SPARSE_OPTIMIZER_KINDS,
    explain_state,
    with_sparse_optimizer,
)
from lightning_embark.planner._partition import (
    FeatureAffinity,
    kept_affinity,
    partition_by_affinity,
    partition_tables,
)
from lightning_embark.planner._partition_plot import plot_affinity
from lightning_embark.planner._plot import plot_plans
from lightning_embark.planner._stats import (
    DataStats,
    FeatureStats,
    from_spec,
    from_synthetic,
    measure,
)
from lightning_embark.planner._tower_choice import (
    ACCURATE_TOWER_SETTINGS,
    TowerDecision,
    TowerSetting,
    choose_towers,
    offered_settings,
    resolve_towers,
    tower_counts,
)
from lightning_embark.planner._towers import plan_with_towers, table_costs

__all__ = [
    "ACCURATE_TOWER_SETTINGS",
    "DEFAULT_SPARSE_OPTIMIZER",
    "SPARSE_OPTIMIZER_KINDS",
    "Calibration",
    "CostModel",
    "DataStats",
    "Estimate",
    "FeatureAffinity",
    "FeatureStats",
    "GreedyConfig",
    "GreedyPlanner",
    "PlanResult",
    "Planner",
    "RankEstimate",
    "TowerDecision",
    "TowerSetting",
    "calibration_for_topology",
    "calibration_names",
    "choose_towers",
    "estimate_plan",
    "explain_state",
    "from_spec",
    "from_synthetic",
    "kept_affinity",
    "load_calibration",
    "measure",
    "measure_affinity",
    "offered_settings",
    "partition_by_affinity",
    "partition_tables",
    "plan_with_towers",
    "plot_affinity",
    "plot_plans",
    "resolve_towers",
    "table_costs",
    "tower_counts",
    "with_sparse_optimizer",
]
