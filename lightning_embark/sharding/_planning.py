"""Obtaining, agreeing on, checking and printing the sharding plan of a module.

Pure functions the strategy calls at setup. A plan is either given (a :class:`Plan`
or a plan file written by ``Plan.save``, ``embark-plan`` or ``embark-tune``) or made
automatically by the greedy planner (:class:`~lightning_embark.planner._greedy.GreedyPlanner`)
under the cost model (:class:`~lightning_embark.planner._cost.CostModel`) of the run's
topology, from the pooling factors and unique ratios measured on a training batch.
Automatic plans are computed on rank 0 only and broadcast, because measured statistics
differ per rank and every rank must execute the same plan; a planning error on rank 0
is broadcast too, so no rank hangs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch.distributed as dist
from torch import nn
from torchrec.modules.embedding_configs import EmbeddingBagConfig

from lightning_embark.calibration import check_calibration_device
from lightning_embark.engine import SparseOptimizer
from lightning_embark.errors import ConfigError, PlanInfeasibleError
from lightning_embark.lists import list_items
from lightning_embark.models import SparseOptimizerSpec
from lightning_embark.plan import Compression, Plan, TowerRequest
from lightning_embark.plan.names import resolve_all
from lightning_embark.planner import (
    DEFAULT_SPARSE_OPTIMIZER,
    CostModel,
    DataStats,
    FeatureStats,
    GreedyConfig,
    GreedyPlanner,
    calibration_for_topology,
    choose_towers,
    explain_state,
    partition_tables,
    plan_with_towers,
    with_sparse_optimizer,
)
from lightning_embark.spec import ModelSpec
from lightning_embark.topology import Topology


def load_plan(plan: Plan | str | Path) -> Plan:
    """``plan`` itself, or the plan stored in that JSON file."""
    if isinstance(plan, Plan):
        return plan
    if isinstance(plan, (str, Path)):
        return Plan.load(plan)
    raise ConfigError(
        f"plan must be a Plan, a plan file path or None, got {type(plan).__name__}: {plan!r}"
    )


def check_allow(allow: Iterable[str | Compression] | str | None) -> tuple[Compression, ...]:
    """The compressions an automatic plan may use, validated (default: lossless only)."""
    if allow is None:
        return (Compression.FP32,)
    if isinstance(allow, str):
        allow = list_items(allow)
    out = []
    for item in allow:
        try:
            out.append(Compression(str(item).strip()))
        except ValueError:
            raise ConfigError(
                f"allow names compression {item!r}; choose from {[c.value for c in Compression]}"
            ) from None
    return tuple(dict.fromkeys(out)) or (Compression.FP32,)


#: Per-rank batch the automatic plan assumes when the caller does not say.
DEFAULT_PLAN_BATCH_SIZE = 512


def automatic_plan(
    spec: ModelSpec,
    topology: Topology,
    *,
    unique_ratios: Mapping[str, float] | None,
    allow: Sequence[Compression],
    batch_size: int | None = None,
    towers: int | str | Sequence[TowerRequest] | None = None,
    sparse_optimizer: str = DEFAULT_SPARSE_OPTIMIZER,
    compute_device: str | None = None,
) -> Plan:
    """The greedy planner's plan for ``spec`` on ``topology``.

    Args:
        spec: The tables; pooling factors are the measured hotness where known.
        topology: The run's cluster; its name picks the compute constants of the
            calibration preset of that name (``emulated`` otherwise), its link figures
            and memory override the preset's (:func:`calibration_for_topology`).
        unique_ratios: Measured distinct IDs / IDs per batch, by table name; tables
            without one use the analytic estimate from the spec.
        allow: Compressions the plan may use (fp32 is always allowed).
        batch_size: Per-rank batch the ratios were measured at
            (default :data:`DEFAULT_PLAN_BATCH_SIZE`).
        towers: None for a flat plan; a count for that many towers from the
            statistics-only partitioner (identity modules); ``"auto"`` for the planner's
            choice between flat and identity towers, recorded in the plan
            (:func:`~lightning_embark.planner.choose_towers`); or tower requests
            (:func:`~lightning_embark.planner.plan_with_towers`).
        sparse_optimizer: The kind of embedding optimizer training will run
            (:func:`planned_sparse_optimizer`): its state is part of the memory the
            tables need (none for ``sgd``, a float per row for ``rowwise_adagrad``,
            a float per element for ``adagrad``).
        compute_device: The device type the plan will run on; a calibration measured on
            another kind (a CPU calibration planning GPUs) is warned about, once, naming
            both (:func:`~lightning_embark.calibration.check_calibration_device`).

    Raises:
        ConfigError: the tables do not fit (names the table, the shortfall and the
            sparse optimizer's share).
    """
    model = planning_model(
        spec,
        topology,
        unique_ratios=unique_ratios,
        batch_size=batch_size,
        sparse_optimizer=sparse_optimizer,
    )
    if compute_device is not None:
        check_calibration_device(model.calib, compute_device)
    planner = GreedyPlanner(GreedyConfig(allow=(Compression.FP32, *allow)))
    try:
        if towers is None:
            return planner.plan(model).plan
        if towers == "auto":
            return choose_towers(model, planner).result.plan
        if isinstance(towers, str):
            raise ConfigError(f"towers={towers!r}: give 'auto', a count or tower requests")
        requests = partition_tables(model, towers) if isinstance(towers, int) else list(towers)
        return plan_with_towers(model, requests, planner).plan
    except PlanInfeasibleError as error:
        raise explain_state(error, sparse_optimizer, how="sparse optimizer") from error


def planning_model(
    spec: ModelSpec,
    topology: Topology,
    *,
    unique_ratios: Mapping[str, float] | None = None,
    batch_size: int | None = None,
    sparse_optimizer: str = DEFAULT_SPARSE_OPTIMIZER,
) -> CostModel:
    """The cost model an automatic plan is made under (see :func:`automatic_plan`).

    Raises:
        ConfigError: a unique ratio outside ``(0, 1]``.
    """
    batch = batch_size or DEFAULT_PLAN_BATCH_SIZE
    known = set(spec.feature_names)
    ratios = {name: ratio for name, ratio in (unique_ratios or {}).items() if name in known}
    for name, ratio in ratios.items():
        if not 0 < ratio <= 1:
            raise ConfigError(f"unique ratio of {name!r} must be in (0, 1], got {ratio!r}")
    tables = {t.name: t for t in spec.tables}
    stats = DataStats(
        batch_size=batch,
        features={
            name: FeatureStats(hotness=tables[name].pooling_factor, unique_ratio=ratio)
            for name, ratio in ratios.items()
        },
        source=f"unique ratios measured on a training batch ({len(ratios)} of {len(tables)} "
        "tables; the rest analytic from the spec)",
        measured=bool(ratios),
    )
    calib = with_sparse_optimizer(calibration_for_topology(topology), sparse_optimizer)
    return CostModel(
        spec,
        calib,
        num_hosts=topology.num_hosts,
        ranks_per_host=topology.ranks_per_host,
        batch_size=batch,
        stats=stats,
    )


def planned_sparse_optimizer(
    module: nn.Module, option: SparseOptimizerSpec | SparseOptimizer | None
) -> str:
    """The kind of sparse optimizer a fit will run, for :func:`automatic_plan`'s memory.

    The same rule the strategy applies when it builds the engine: the strategy's
    ``sparse_optimizer`` option, else the module's ``sparse_optimizer_spec()``, else
    row-wise Adagrad.
    """
    if option is None:
        get_spec = getattr(module, "sparse_optimizer_spec", None)
        option = get_spec() if callable(get_spec) else SparseOptimizerSpec()
    if isinstance(option, (SparseOptimizerSpec, SparseOptimizer)):
        return str(option.kind)
    raise ConfigError(
        "sparse_optimizer must be a SparseOptimizerSpec, an engine SparseOptimizer or None, got "
        f"{type(option).__name__}: {option!r}"
    )


def torchrec_planner_plan(
    spec: ModelSpec,
    topology: Topology,
    *,
    batch_size: int | None = None,
    compute_device: str = "cpu",
) -> Plan:
    """torchrec's planner's plan for ``spec`` on ``topology``, as our :class:`Plan`.

    The same planning the ``torchrec`` strategy does (torchrec's default proposers,
    the spec's pooling factors, the sharder offering every sharding type), imported
    as fp32 RB clusters (hierarchical for table-row-wise and grid) and a DP cluster:
    the engine then executes torchrec's layout, so that planners, not engines, are
    compared.

    Args:
        batch_size: Per-rank batch torchrec's cost model assumes
            (default :data:`DEFAULT_PLAN_BATCH_SIZE`).
        compute_device: Device type torchrec plans for (its kernels and bandwidths).
    """
    from lightning_embark.baseline import plan_from_torchrec, torchrec_plan

    planning = torchrec_plan(
        spec,
        num_hosts=topology.num_hosts,
        ranks_per_host=topology.ranks_per_host,
        batch_size=batch_size or DEFAULT_PLAN_BATCH_SIZE,
        topology=topology,
        compute_device=compute_device,
    )
    return plan_from_torchrec(
        planning.plan, spec, world_size=topology.world_size, ranks_per_host=topology.ranks_per_host
    )


def agree_on_plan(make: Callable[[], Plan], *, group: Any = None) -> Plan:
    """``make()`` on rank 0, broadcast to every rank of ``group`` (all ranks call this).

    Raises:
        ConfigError: on every rank, when planning failed on rank 0 (its message).
    """
    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return make()
    payload: list[Any] = [None]
    if dist.get_rank(group) == 0:
        try:
            payload[0] = {"plan": make().to_dict()}
        except ConfigError as error:
            payload[0] = {"error": str(error)}
    dist.broadcast_object_list(payload, group_src=0, group=group)
    if "error" in payload[0]:
        raise ConfigError(f"automatic planning failed on rank 0: {payload[0]['error']}")
    return Plan.from_dict(payload[0]["plan"])


def validate_plan(plan: Plan, configs: Sequence[EmbeddingBagConfig], *, world_size: int) -> None:
    """Prove ``plan`` executes the module's tables on ``world_size`` ranks.

    Checks run before anything is built, identically on every rank, so a bad plan
    fails everywhere with the same message instead of hanging a collective. The
    layouts themselves are checked by :meth:`~lightning_embark.plan.Plan.validate`.

    Raises:
        ConfigError: the world size differs, a table is missing from the plan or the
            plan lays out tables the module does not have, or a layout does not fit
            its table (column shards not dividing the width, too many row shards).
    """
    if plan.world_size != world_size:
        raise ConfigError(
            f"the plan is for {plan.world_size} ranks ({plan.num_hosts} hosts x "
            f"{plan.ranks_per_host}) but this job runs {world_size}; launch {plan.world_size} "
            f"ranks, or re-plan for {world_size} (omit plan= to plan automatically)"
        )
    planned = [t.table for t in plan.tables]
    names = resolve_all(configs, planned)  # raises naming every missing table
    extra = sorted(set(planned) - set(names))
    if extra:
        raise ConfigError(
            f"the plan lays out tables {extra} that the module does not have (module tables: "
            f"{[c.name for c in configs]}); this plan was made for another model - re-plan"
        )
    plan.validate(ModelSpec.from_configs(configs, name="module", names=names))
