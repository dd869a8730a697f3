"""torchrec's planner, fed with our topology and the model spec's statistics.

A fair baseline plans with torchrec's own ``EmbeddingShardingPlanner`` (default
enumerator, proposers and ``GreedyPerfPartitioner``), but gives it the same inputs the
embark planner gets: the real cluster shape, link bandwidths and memory per rank,
the per-rank batch size and each table's pooling factor. Everything here is a pure
function so that the strategy stays a thin shell and tests can plan without
processes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import torch.distributed as dist
from torch import nn
from torchrec.distributed.embedding_types import ShardingType
from torchrec.distributed.planner import EmbeddingShardingPlanner
from torchrec.distributed.planner.constants import POOLING_FACTOR
from torchrec.distributed.planner.types import (
    HardwareConfig,
    KernelConfig,
    ParameterConstraints,
    TopologyFactory,
    TrainerConfig,
)
from torchrec.distributed.planner.types import Topology as TorchrecTopology
from torchrec.distributed.types import ModuleSharder, ShardingPlan

from lightning_embark._logs import quiet_torchrec_planner
from lightning_embark.baseline._towers import order_towers_by_host
from lightning_embark.errors import ConfigError
from lightning_embark.spec import ModelSpec
from lightning_embark.topology import (
    Topology,
)


def to_torchrec_topology(topology: Topology, *, compute_device: str) -> TorchrecTopology:
    """torchrec's planner topology with our shape, bandwidths and memory.

    Our bandwidths are bytes/s per rank; torchrec's are bytes/ms per rank. Memory per
    rank is HBM on accelerators and DDR on CPU (torchrec's defaults where unknown).
    torchrec's cost model has no latency terms, so latencies are not carried over.
    """
    if compute_device not in ("cpu", "cuda", "mtia"):
        raise ConfigError(f"torchrec plans for cpu, cuda or mtia, not {compute_device!r}")
    on_accelerator = compute_device != "cpu"
    memory = topology.memory_per_rank
    return TopologyFactory.create_topology(
        trainer_config=TrainerConfig(
            world_size=topology.world_size,
            local_world_size=topology.ranks_per_host,
            hbm_cap_bytes=memory if on_accelerator else None,
            ddr_cap_bytes=None if on_accelerator else memory,
        ),
        hardware_config=HardwareConfig(
            intra_host_bw=topology.intra_host_bandwidth / 1000.0,
            inter_host_bw=topology.inter_host_bandwidth / 1000.0,
        ),
        # Without use_hardware_based_bandwidth the factory ignores the bandwidths above
        # and plans with its defaults (600 GB/s intra, 12.5 GB/s inter host).
        kernel_config=KernelConfig(
            compute_device=compute_device, use_hardware_based_bandwidth=True
        ),
    )


def constraints_from_spec(spec: ModelSpec) -> dict[str, ParameterConstraints]:
    """Per-table planner constraints carrying only the spec's pooling factors."""
    return {
        config.name: ParameterConstraints(pooling_factors=[table.pooling_factor])
        for table, config in zip(spec.tables, spec.embedding_bag_configs(), strict=False)
    }


def merge_constraints(
    base: Mapping[str, ParameterConstraints],
    overrides: Mapping[str, ParameterConstraints] | None,
) -> dict[str, ParameterConstraints]:
    """``overrides`` win per table; a table they leave at torchrec's default pooling
    factor keeps the one from ``base`` (the spec knows better than the default)."""
    merged = dict(base)
    for name, constraint in (overrides or {}).items():
        if name in base and list(constraint.pooling_factors) == [POOLING_FACTOR]:
            constraint = dataclasses.replace(
                constraint, pooling_factors=base[name].pooling_factors
            )
        merged[name] = constraint
    return merged


def check_sharding_types(sharding_types: Sequence[str], *, where: str) -> tuple[str, ...]:
    """``sharding_types`` as a tuple, if every one is a torchrec ``ShardingType`` value.

    Raises:
        ConfigError: an unknown or empty list, naming ``where`` it came from.
    """
    known = [t.value for t in ShardingType]
    types = (sharding_types,) if isinstance(sharding_types, str) else tuple(sharding_types)
    unknown = [t for t in types if t not in known]
    if unknown or not types:
        raise ConfigError(
            f"{where} sharding_types={list(types)!r}: give one or more of {known}, e.g. "
            "['table_row_wise']"
        )
    return types


def check_constraints_within(
    constraints: Mapping[str, ParameterConstraints] | None,
    sharding_types: Sequence[str],
    *,
    where: str,
) -> None:
    """Refuse per-table ``constraints`` that choose a sharding type outside
    ``sharding_types``, which apply to every table (:func:`force_sharding_types` would
    otherwise override the table's own choice silently).

    Raises:
        ConfigError: naming the tables, their choices and ``where`` they came from.
    """
    chosen = {
        name: c.sharding_types
        for name, c in (constraints or {}).items()
        if c.sharding_types and set(c.sharding_types) - set(sharding_types)
    }
    if chosen:
        raise ConfigError(
            f"{where} constraints choose sharding types {chosen} outside "
            f"sharding_types={list(sharding_types)}, which apply to every table; drop "
            "one of the two"
        )


def force_sharding_types(
    constraints: Mapping[str, ParameterConstraints],
    tables: Sequence[str],
    sharding_types: Sequence[str],
) -> dict[str, ParameterConstraints]:
    """``constraints`` with every table of ``tables`` limited to ``sharding_types``.

    What a baseline with one layout for every table needs (``torchrec-twrw``: the
    table-row-wise baseline the EMBark paper reports against): torchrec's planner then
    only chooses among them, the ranks and the kernels. A table's other constraints (the
    spec's pooling factor) are kept, and so is a narrower choice among ``sharding_types``.
    """
    forced = dict(constraints)
    for name in tables:
        constraint = constraints.get(name, ParameterConstraints())
        narrower = [t for t in constraint.sharding_types or () if t in sharding_types]
        forced[name] = dataclasses.replace(
            constraint, sharding_types=narrower or list(sharding_types)
        )
    return forced


def plan_with_torchrec(
    module: nn.Module,
    sharders: list[ModuleSharder[nn.Module]],
    *,
    topology: TorchrecTopology,
    batch_size: int | None = None,
    constraints: Mapping[str, ParameterConstraints] | None = None,
    pg: dist.ProcessGroup | None = None,
) -> ShardingPlan:
    """torchrec's default planner over ``module``.

    With ``pg`` the plan is computed on rank 0 and broadcast (``collective_plan``), so
    every rank shards identically; without, it is computed locally (for reports and
    tests). Tower collections' towers then go to the planner's hosts in their own order
    (:func:`~lightning_embark.baseline._towers.order_towers_by_host`), the only order in
    which torchrec's sharded towers return what the unsharded ones do.

    Args:
        batch_size: Per-rank batch size the cost model assumes (torchrec: 512).
    """
    if batch_size is not None and batch_size < 1:
        raise ConfigError(f"planner batch_size must be a positive integer, got {batch_size!r}")
    planner = EmbeddingShardingPlanner(
        topology=topology,
        batch_size=batch_size,
        constraints=dict(constraints) if constraints else None,
    )
    with quiet_torchrec_planner():
        plan = (
            planner.plan(module, sharders)
            if pg is None
            else planner.collective_plan(module, sharders, pg)
        )
    return order_towers_by_host(plan, module, ranks_per_host=topology.local_world_size)


def plan_table_layout(plan: ShardingPlan) -> dict[str, tuple[str, list[int]]]:
    """``module_path.table`` -> (sharding type, ranks holding a shard, in shard order)."""
    layout: dict[str, tuple[str, list[int]]] = {}
    for module_path, module_plan in plan.plan.items():
        for table, sharding in module_plan.items():
            layout[f"{module_path}.{table}"] = (sharding.sharding_type, list(sharding.ranks or []))
    return layout


def plan_summary(plan: ShardingPlan, topology: Topology | None = None) -> str:
    """One line per table: sharding type, compute kernel and the ranks holding shards."""
    lines = []
    if topology is not None:
        lines.append(
            f"topology {topology.name}: {topology.num_hosts} host(s) x "
            f"{topology.ranks_per_host} rank(s)"
        )
    for module_path, module_plan in plan.plan.items():
        lines.append(f"{module_path}:")
        for table, sharding in module_plan.items():
            ranks = sharding.ranks if sharding.ranks is not None else "all"
            lines.append(
                f"  {table}: {sharding.sharding_type} ({sharding.compute_kernel}) ranks={ranks}"
            )
    return "\n".join(lines)
