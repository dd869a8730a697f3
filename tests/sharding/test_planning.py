"""validate_plan names both sides of a renamed table; the automatic plan counts the sparse
optimizer's state the fit will run."""

from __future__ import annotations

import dataclasses

import pytest
from torch import nn
from torchrec.modules.embedding_configs import EmbeddingBagConfig

from lightning_embark.engine import OptimizerKind, SparseOptimizer
from lightning_embark.errors import ConfigError, PlanInfeasibleError
from lightning_embark.models import SparseOptimizerSpec
from lightning_embark.plan import ClusterPlan, ClusterType, Compression, Plan, layouts
from lightning_embark.sharding import automatic_plan, planned_sparse_optimizer, validate_plan
from lightning_embark.spec import ModelSpec, TableSpec
from lightning_embark.topology import Topology, topology_preset


def _configs() -> list[EmbeddingBagConfig]:
    return [
        EmbeddingBagConfig(name=f"t_{f}", num_embeddings=100, embedding_dim=8, feature_names=[f])
        for f in ("x", "y")
    ]


def _plan(tables: list[str]) -> Plan:
    return Plan(
        world_size=1,
        ranks_per_host=1,
        clusters=(ClusterPlan(name="rb", type=ClusterType.RB),),
        tables=tuple(layouts.table_wise(t, "rb", 0) for t in tables),
    )


def test_a_renamed_table_names_the_plans_unknown_table() -> None:
    with pytest.raises(ConfigError) as caught:
        validate_plan(_plan(["x_renamed", "y"]), _configs(), world_size=1)
    message = str(caught.value)
    assert "table 't_x' (features ['x']) is missing from the plan" in message
    assert "add a layout named 'x' or 't_x'" in message
    assert "match no table of the model: ['x_renamed']" in message
    validate_plan(_plan(["x", "t_y"]), _configs(), world_size=1)


def _near_limit() -> tuple[ModelSpec, Topology]:
    """256 MB of weights on 2 ranks of 200 MB: fits with row-wise Adagrad, not Adagrad."""
    table = TableSpec(name="big", num_embeddings=1_000_000, embedding_dim=64, pooling_factor=1.0)
    topology = dataclasses.replace(
        topology_preset("emulated", num_hosts=1, ranks_per_host=2), memory_per_rank=200_000_000
    )
    return ModelSpec(name="near-limit", tables=(table,)), topology


def test_the_automatic_plan_counts_the_sparse_optimizers_state() -> None:
    spec, topology = _near_limit()
    options = {"unique_ratios": None, "allow": (Compression.FP32,)}
    plan = automatic_plan(spec, topology, **options)  # row-wise Adagrad, as before
    plan.validate(spec, topology)
    automatic_plan(spec, topology, sparse_optimizer="sgd", **options)
    with pytest.raises(PlanInfeasibleError) as info:
        automatic_plan(spec, topology, sparse_optimizer="adagrad", **options)
    message = str(info.value)
    assert "table 'big' does not fit" in message and info.value.table == "big"
    assert "state for sparse optimizer adagrad: adagrad keeps 4 bytes of state per element" in (
        message
    )
    with pytest.raises(ConfigError, match=r"sparse optimizer 'adam' is unknown"):
        automatic_plan(spec, topology, sparse_optimizer="adam", **options)


class _WithSpec(nn.Module):
    def sparse_optimizer_spec(self) -> SparseOptimizerSpec:
        return SparseOptimizerSpec(kind="adagrad")


def test_the_planned_sparse_optimizer_is_the_one_the_fit_runs() -> None:
    assert planned_sparse_optimizer(nn.Linear(1, 1), None) == "rowwise_adagrad"
    assert planned_sparse_optimizer(_WithSpec(), None) == "adagrad"
    assert planned_sparse_optimizer(_WithSpec(), SparseOptimizerSpec(kind="sgd")) == "sgd"
    engine = SparseOptimizer(kind=OptimizerKind.ROWWISE_ADAGRAD)
    assert planned_sparse_optimizer(_WithSpec(), engine) == "rowwise_adagrad"
    with pytest.raises(ConfigError, match="sparse_optimizer must be"):
        planned_sparse_optimizer(_WithSpec(), "sgd")  # type: ignore[arg-type]


def test_a_cpu_calibration_planning_gpus_is_named(caplog) -> None:
    """The emulated (CPU, gloo) figures planning a CUDA run price lookups and codecs by a
    CPU's speed: the plan is made, with one warning that names both kinds."""
    import logging

    from lightning_embark.sharding import automatic_plan
    from lightning_embark.spec import load_spec
    from lightning_embark.topology import resolve_topology

    spec = load_spec("demo-small", max_rows=1000)
    topology = resolve_topology("emulated", world_size=2, default_ranks_per_host=2)
    with caplog.at_level(logging.WARNING):
        automatic_plan(spec, topology, unique_ratios=None, allow=(), compute_device="cuda")
    messages = [r.getMessage() for r in caplog.records if "cuda" in r.getMessage()]
    assert len(messages) == 1 and "cpu" in messages[0], messages
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        automatic_plan(spec, topology, unique_ratios=None, allow=(), compute_device="cpu")
    assert not [r for r in caplog.records if "cuda" in r.getMessage()]
