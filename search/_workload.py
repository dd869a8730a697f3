"""What a study's configuration means to the planner: the cost model of its cluster and
workload, the search space over its plans, and the greedy plan that is trial 0."""

from __future__ import annotations

import optuna

from lightning_embark.plan import Plan
from lightning_embark.planner import CostModel, DataStats, load_calibration
from lightning_embark.search._config import TuneConfig
from lightning_embark.search._space import SearchSpace
from lightning_embark.spec import load_spec


def cost_model(config: TuneConfig) -> CostModel:
    """The planner's cost model for the study's spec, topology, cluster and batch."""
    spec = load_spec(config.model, max_rows=config.max_rows)
    calib = load_calibration(config.topology)
    stats = DataStats.load(config.stats) if config.stats else None
    return CostModel(
        spec,
        calib,
        num_hosts=config.num_hosts,
        ranks_per_host=config.ranks_per_host,
        batch_size=config.batch_size,
        stats=stats,
    )


def space_for(config: TuneConfig, model: CostModel) -> SearchSpace:
    """The search space over the plans the user's allowed compressions permit."""
    return SearchSpace(
        allow=config.allow,
        num_hosts=config.num_hosts,
        ranks_per_host=config.ranks_per_host,
        max_dim=max(t.embedding_dim for t in model.spec.tables),
        towers=config.towers,
    )


def greedy_plan(config: TuneConfig) -> Plan:
    """The greedy plan of trial 0 (raises the planner's error when nothing fits)."""
    model = cost_model(config)
    space = space_for(config, model)
    plan, _ = space.plan(optuna.trial.FixedTrial(space.greedy_params()), model)
    return plan
