"""What a trial may change: the greedy planner's knobs and per-cluster overrides of its choices.

A trial never writes a layout by hand. Its knobs (:class:`~lightning_embark.planner.GreedyConfig`:
whether tables may be data parallel and how much memory replicas take, the UB threshold,
caps on row and column splits, the narrowest column shard) go through the greedy planner,
so every candidate is a plan the planner could have made, placed, validated and fitted
to memory the same way. Then each exchanged cluster of that plan may override the two
wire choices the planner made for it from its cost model: compression (from the set the
user allows) and the hierarchical exchange. ``"auto"`` keeps the planner's choice, so the
all-``auto`` parameters with the knobs' defaults are exactly the greedy plan (trial 0).

Overrides are suggested only for clusters the plan has (define-by-run: the set depends on
the knobs), and only where they are a choice at all (several allowed compressions,
several hosts). DP clusters have no wire choices, and the clusters of a tower's host
(one host) no hierarchical one.

With ``towers=True`` the space also asks what ``towers="auto"`` chooses among: how many
DMT towers to plan (0: flat, else ``H``, ``2 H`` or ``L H`` towers from the
statistics-only partitioner, planned by :func:`~lightning_embark.planner.plan_with_towers`
under the same knobs) and their module: ``identity`` (the model unchanged)
or one of the compressing settings shown to keep accuracy
(:data:`~lightning_embark.planner.ACCURATE_TOWER_SETTINGS`). A step-time study cannot
weigh accuracy, so it is offered only settings whose accuracy was measured; the measured
run trains the model over those towers (:mod:`._measure`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any, Protocol

from lightning_embark.errors import ConfigError
from lightning_embark.plan import ClusterType, Compression, Plan
from lightning_embark.planner import (
    CostModel,
    GreedyConfig,
    GreedyPlanner,
    PlanResult,
    TowerSetting,
    offered_settings,
    partition_tables,
    plan_with_towers,
)

AUTO = "auto"
#: Greedy's defaults, the values trial 0 enqueues (see :func:`SearchSpace.greedy_params`).
_DEFAULTS = GreedyConfig()
_DP_FRACTION = (0.01, 0.5)
_UB_THRESHOLD = (0.25, 4.0)
_MIN_COL_WIDTHS = (8, 16, 32)


class Suggester(Protocol):
    """The part of :class:`optuna.trial.Trial` a space needs (a fixed dict in tests)."""

    def suggest_categorical(self, name: str, choices: Sequence[Any]) -> Any: ...

    def suggest_float(self, name: str, low: float, high: float, *, log: bool = False) -> float: ...


def plan_key(plan: Plan) -> str:
    """The plan's canonical JSON: equal plans, equal keys (what the trial cache keys on)."""
    return json.dumps(plan.to_dict(), sort_keys=True, separators=(",", ":"))


class SearchSpace:
    """Knobs and overrides for one model on one cluster shape.

    Args:
        allow: Compressions a cluster may use (fp32 is always allowed).
        num_hosts: Hosts of the cluster (hierarchical choices need several).
        ranks_per_host: Ranks per host.
        max_dim: The widest table (bounds the column-split caps).
        towers: Whether to search DMT towers too (several hosts only): their count and
            module (see the module docstring).
        tower_settings: The tower modules offered (None: what ``towers="auto"``
            offers, :func:`~lightning_embark.planner.offered_settings`).
    """

    def __init__(
        self,
        *,
        allow: Sequence[str | Compression],
        num_hosts: int,
        ranks_per_host: int,
        max_dim: int,
        towers: bool = False,
        tower_settings: Sequence[TowerSetting] | None = None,
    ) -> None:
        self.allow = tuple(
            sorted(
                {Compression.FP32, *(Compression(a) for a in allow)}, key=list(Compression).index
            )
        )
        self.num_hosts, self.ranks_per_host = num_hosts, ranks_per_host
        self.tower_counts: tuple[int, ...] = (
            (0, *sorted({num_hosts, 2 * num_hosts, ranks_per_host * num_hosts}))
            if towers and num_hosts > 1
            else ()
        )
        settings = offered_settings(None, None) if tower_settings is None else tower_settings
        self.tower_settings = {_label(s): s for s in settings}
        world = num_hosts * ranks_per_host
        self.row_caps: tuple[int | None, ...] = (
            None,
            *sorted({2**i for i in range(world.bit_length()) if 2**i < world}, reverse=True),
        )
        self.col_caps: tuple[int | None, ...] = (
            None,
            *sorted({2**i for i in range(max_dim.bit_length()) if 2**i < max_dim}, reverse=True)[
                -4:
            ],
        )

    def greedy_params(self) -> dict[str, Any]:
        """Parameters that reproduce the greedy plan: the knobs' defaults, every override
        ``auto`` (for every cluster a plan could have; Optuna uses those it suggests)."""
        params: dict[str, Any] = {
            "dp": _DEFAULTS.dp,
            "dp_fraction": _DEFAULTS.dp_fraction,
            "ub_threshold": _DEFAULTS.ub_threshold,
            "max_row_shards": _DEFAULTS.max_row_shards,
            "max_col_shards": _DEFAULTS.max_col_shards,
            "min_col_width": _DEFAULTS.min_col_width,
        }
        for name in ("rb", "rb_rows", "ub"):
            params |= {f"{name}.compression": AUTO, f"{name}.hierarchical": AUTO}
        if self.tower_counts:
            params["towers"] = 0
        return params

    def config(self, trial: Suggester) -> GreedyConfig:
        """The planner's knobs for ``trial``."""
        dp = bool(trial.suggest_categorical("dp", [True, False]))
        fraction = trial.suggest_float("dp_fraction", *_DP_FRACTION, log=True) if dp else 0.1
        return GreedyConfig(
            allow=self.allow,
            dp=dp,
            dp_fraction=fraction,
            ub_threshold=trial.suggest_float("ub_threshold", *_UB_THRESHOLD, log=True),
            max_row_shards=trial.suggest_categorical("max_row_shards", list(self.row_caps)),
            max_col_shards=trial.suggest_categorical("max_col_shards", list(self.col_caps)),
            min_col_width=trial.suggest_categorical("min_col_width", list(_MIN_COL_WIDTHS)),
        )

    def override(self, trial: Suggester, plan: Plan) -> Plan:
        """``plan`` with each exchanged cluster's compression and hierarchical flag as
        ``trial`` says (``auto`` keeps the planner's)."""
        in_towers = {t for tower in plan.towers for t in tower.tables}
        host_clusters = {t.cluster for t in plan.tables if t.table in in_towers}
        clusters = []
        for cluster in plan.clusters:
            if cluster.type is ClusterType.DP:
                clusters.append(cluster)
                continue
            changes: dict[str, Any] = {}
            if len(self.allow) > 1:
                choice = trial.suggest_categorical(
                    f"{cluster.name}.compression", [AUTO, *(c.value for c in self.allow)]
                )
                if choice != AUTO:
                    changes |= {"forward_compression": choice, "backward_compression": choice}
            if self.num_hosts > 1 and cluster.name not in host_clusters:
                flag = trial.suggest_categorical(
                    f"{cluster.name}.hierarchical", [AUTO, "on", "off"]
                )
                if flag != AUTO:
                    changes["hierarchical"] = flag == "on"
            clusters.append(dataclasses.replace(cluster, **changes))
        return dataclasses.replace(plan, clusters=tuple(clusters))

    def tower_setting(self, trial: Suggester) -> TowerSetting:
        """The towers' module: asked as ``tower_module`` when more than one is offered."""
        offered = list(self.tower_settings)
        if len(offered) == 1:
            return self.tower_settings[offered[0]]
        return self.tower_settings[trial.suggest_categorical("tower_module", offered)]

    def plan(self, trial: Suggester, model: CostModel) -> tuple[Plan, PlanResult]:
        """The candidate of ``trial``: the greedy plan under its knobs, then its overrides.

        Returns:
            The candidate plan and the planner's result it started from.

        Raises:
            PlanInfeasibleError: the knobs leave no layout that fits memory.
        """
        planner = GreedyPlanner(self.config(trial))
        count = (
            int(trial.suggest_categorical("towers", list(self.tower_counts)))
            if self.tower_counts
            else 0
        )
        if count:
            setting = self.tower_setting(trial)
            requests = partition_tables(
                model, count, module=setting.module, output_ratio=setting.output_ratio
            )
            result = plan_with_towers(model, requests, planner)
        else:
            result = planner.plan(model)
        plan = self.override(trial, result.plan)
        topology = model.calib.topology(
            num_hosts=model.num_hosts, ranks_per_host=model.ranks_per_host
        )
        plan.validate(model.spec, topology, bytes_per_row_element=model.calib.bytes_per_element)
        return plan, result


def _label(setting: TowerSetting) -> str:
    """``identity`` or e.g. ``dot r4``: a tower setting as a trial parameter's value."""
    ratio = "" if setting.output_ratio is None else f" r{setting.output_ratio:g}"
    return f"{setting.module.value}{ratio}"


def differing_params(params: dict[str, Any], greedy: dict[str, Any]) -> dict[str, Any]:
    """The parameters of a trial that differ from the greedy plan's (for the report)."""
    return {k: v for k, v in sorted(params.items()) if greedy.get(k, object()) != v}


def check_allow(allow: Sequence[str]) -> tuple[str, ...]:
    """``allow`` as compression names, or a clear error naming the unknown ones."""
    known = [c.value for c in Compression]
    unknown = [a for a in allow if a not in known]
    if unknown:
        raise ConfigError(f"--allow names unknown compressions {unknown}; choose from {known}")
    return tuple(allow)
