"""torchrec ``ShardingPlan`` <-> :class:`Plan`, and torchrec's planner as a baseline.

torchrec's layouts are pooled (reduction-based) exchanges, so an imported plan puts
every sharded table in an RB cluster at fp32: table-row-wise and grid tables in a
hierarchical one (torchrec reduces them inside the host first), the rest in a flat
one; data-parallel tables in a DP cluster. Export is the inverse where torchrec can
express the layout: DP, TW, CW/TWCW, RW over the whole world, TWRW over one host and
grid; row shards must be contiguous ranges (torchrec has no hash split) and tables
must not be replicated outside a DP cluster.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch.distributed._shard.sharding_spec import EnumerableShardingSpec, ShardMetadata
from torchrec.distributed.types import EmbeddingModuleShardingPlan, ParameterSharding, ShardingPlan

from lightning_embark._logs import quiet_torchrec_planner
from lightning_embark.errors import ConfigError
from lightning_embark.plan import ClusterPlan, ClusterType, Plan, RowSplit, TableLayout
from lightning_embark.spec import ModelSpec

PREFIX = "t_"  # ModelSpec.embedding_bag_configs names tables t_<name>
_HIERARCHICAL = ("table_row_wise", "grid_shard")


def plan_from_torchrec(
    sharding: ShardingPlan, spec: ModelSpec, *, world_size: int, ranks_per_host: int
) -> Plan:
    """Our :class:`Plan` of a torchrec plan over ``spec``'s tables (any module path).

    Raises:
        ConfigError: a table is missing, or its shards are not an even grid.
    """
    params: dict[str, ParameterSharding] = {}
    for module_plan in sharding.plan.values():
        for name, param in module_plan.items():
            params[name.removeprefix(PREFIX)] = param
    layouts = []
    for table in spec.tables:
        param = params.get(table.name)
        if param is None:
            raise ConfigError(
                f"torchrec plan has no sharding for table {table.name!r} ({PREFIX}{table.name})"
            )
        kind = str(param.sharding_type)
        if kind == "data_parallel":
            layouts.append(
                TableLayout(
                    table=table.name,
                    cluster="dp",
                    num_replicas=world_size,
                    ranks=tuple((r,) for r in range(world_size)),
                )
            )
            continue
        shards = list(param.sharding_spec.shards) if param.sharding_spec is not None else []
        # torchrec gives ranks past the last row an empty shard (tiny tables); they hold nothing
        shards = [s for s in shards if s.shard_sizes[0] > 0] or shards[:1]
        if not shards:
            raise ConfigError(
                f"table {table.name!r}: torchrec {kind} sharding has no shard metadata"
            )
        rows = sorted({s.shard_offsets[0] for s in shards})
        cols = sorted({s.shard_offsets[1] for s in shards})
        widths = {s.shard_sizes[1] for s in shards}
        if len(widths) != 1 or len(rows) * len(cols) != len(shards):
            raise ConfigError(
                f"table {table.name!r}: torchrec {kind} shards "
                f"{[(s.shard_offsets, s.shard_sizes) for s in shards]} "
                "are not an even grid of equal-width columns; the plan format cannot express them"
            )
        ranks = [0] * len(shards)
        for s in shards:
            ranks[rows.index(s.shard_offsets[0]) * len(cols) + cols.index(s.shard_offsets[1])] = (
                s.placement.rank()
            )
        cluster = "tr_hier" if kind in _HIERARCHICAL and world_size > ranks_per_host else "tr"
        layouts.append(
            TableLayout(
                table=table.name,
                cluster=cluster,
                num_row_shards=len(rows),
                num_col_shards=len(cols),
                row_split=RowSplit.RANGE if len(rows) > 1 else RowSplit.HASH,
                ranks=(tuple(ranks),),
            )
        )
    used = {t.cluster for t in layouts}
    clusters = [ClusterPlan(name="dp", type=ClusterType.DP)] if "dp" in used else []
    clusters += [ClusterPlan(name="tr", type=ClusterType.RB)] if "tr" in used else []
    clusters += (
        [ClusterPlan(name="tr_hier", type=ClusterType.RB, hierarchical=True)]
        if "tr_hier" in used
        else []
    )
    return Plan(
        world_size=world_size,
        ranks_per_host=ranks_per_host,
        clusters=tuple(clusters),
        tables=tuple(layouts),
    )


def plan_to_torchrec(
    plan: Plan, spec: ModelSpec, *, device: str = "cuda", module_path: str = ""
) -> ShardingPlan:
    """torchrec's plan for ``plan`` (module at ``module_path``).

    Raises:
        ConfigError: a layout torchrec cannot express; names the table and why.
    """
    module_plan = EmbeddingModuleShardingPlan()
    local, world = plan.ranks_per_host, plan.world_size
    for table in spec.tables:
        layout = plan.layout(table.name)
        cluster = plan.cluster(layout.cluster)
        if cluster.type is ClusterType.DP:
            module_plan[PREFIX + table.name] = ParameterSharding(
                sharding_type="data_parallel", compute_kernel="dense", ranks=list(range(world))
            )
            continue
        k, c = layout.num_row_shards, layout.num_col_shards
        why = None
        if layout.num_replicas != 1:
            why = f"{layout.num_replicas} replica groups outside a DP cluster"
        elif k > 1 and layout.row_split is not RowSplit.RANGE:
            why = "hash row split (torchrec splits rows into contiguous ranges)"
        ranks = list(layout.ranks[0]) if why is None else []
        kind = None if why else _torchrec_kind(ranks, k, c, local, world)
        if why is None and kind is None:
            why = f"(k={k}, c={c}) on ranks {ranks} matches no torchrec sharding type"
        if why is not None:
            raise ConfigError(
                f"table {table.name!r} cannot be exported to torchrec: {why}; re-plan without it"
            )
        width = table.embedding_dim // c
        shards = []
        for i in range(k):
            start, end = layout.row_range(i, table.num_embeddings)
            for j in range(c):
                shards.append(
                    ShardMetadata(
                        shard_offsets=[start, j * width],
                        shard_sizes=[end - start, width],
                        placement=f"rank:{ranks[i * c + j]}/{device}",
                    )
                )
        module_plan[PREFIX + table.name] = ParameterSharding(
            sharding_type=kind,
            compute_kernel="fused",
            ranks=ranks,
            sharding_spec=EnumerableShardingSpec(shards),
        )
    return ShardingPlan(plan={module_path: module_plan})


def _torchrec_kind(ranks: list[int], k: int, c: int, local: int, world: int) -> str | None:
    if k == 1 and c == 1:
        return "table_wise"
    if k == 1:
        return "column_wise"
    hosts = {r // local for r in ranks}
    if c == 1 and k == world and ranks == list(range(world)):
        return "row_wise"
    if c == 1 and len(hosts) == 1 and sorted(ranks) == ranks:
        return "table_row_wise"
    per_host = [ranks[j::c] for j in range(c)]
    if k == local and all(
        len({r // local for r in col}) == 1 and sorted(col) == col for col in per_host
    ):
        return "grid_shard"
    return None


@dataclass(frozen=True, kw_only=True)
class TorchrecPlanning:
    """torchrec's planner's answer and how it got there.

    Attributes:
        plan: The ``ShardingPlan``.
        seconds: Wall time of ``planner.plan`` (enumeration included).
        search_seconds: Wall time of the proposal search alone (what torchrec's
            ``timeout_seconds`` bounds).
        num_proposals: Proposals the planner partitioned and rated.
        timed_out: The search stopped at ``timeout_seconds`` and returned the best
            plan found until then.
    """

    plan: ShardingPlan
    seconds: float
    search_seconds: float
    num_proposals: int
    timed_out: bool


def torchrec_plan(
    spec: ModelSpec,
    *,
    num_hosts: int,
    ranks_per_host: int,
    batch_size: int,
    topology,
    proposer: str = "default",
    compute_device: str = "cuda",
    timeout_seconds: int | None = None,
    sharding_types: Sequence[str] | None = None,
) -> TorchrecPlanning:
    """Run torchrec's planner over ``spec`` (meta-device tables) and time it.

    Args:
        topology: Our :class:`Topology` for the cluster.
        proposer: ``"default"`` (torchrec's default proposers) or ``"greedy"``
            (``GreedyProposer`` alone).
        timeout_seconds: torchrec's own search budget: past it the planner stops
            proposing and returns the best plan found so far. ``None``: search to
            the end, which takes hours for hundreds of tables on 64+ ranks.
        sharding_types: torchrec sharding types every table is limited to (e.g.
            ``["table_row_wise"]``, as ``TorchrecStrategy(sharding_types=...)`` limits its
            planner); None lets the planner choose per table.
    """
    from torchrec.distributed.planner import EmbeddingShardingPlanner
    from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
    from torchrec.distributed.planner.proposers import GreedyProposer
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    from lightning_embark.baseline._sharders import AllShardingTypesEBCSharder
    from lightning_embark.baseline._torchrec_planning import (
        constraints_from_spec,
        force_sharding_types,
        to_torchrec_topology,
    )

    if proposer not in ("default", "greedy"):
        raise ConfigError(f"torchrec proposer must be 'default' or 'greedy', got {proposer!r}")
    if timeout_seconds is not None and timeout_seconds <= 0:
        raise ConfigError(
            f"timeout_seconds must be positive, got {timeout_seconds}; pass None for no limit"
        )
    module = EmbeddingBagCollection(
        tables=spec.embedding_bag_configs(), device=torch.device("meta")
    )
    torchrec_topology = to_torchrec_topology(topology, compute_device=compute_device)
    constraints = constraints_from_spec(spec)
    if sharding_types is not None:
        names = [c.name for c in spec.embedding_bag_configs()]
        constraints = force_sharding_types(constraints, names, sharding_types)
    enumerated_at: list[float] = []

    class _TimedEnumerator(EmbeddingEnumerator):
        def enumerate(self, *args, **kwargs):
            options = super().enumerate(*args, **kwargs)
            enumerated_at.append(time.perf_counter())
            return options

    planner = EmbeddingShardingPlanner(
        topology=torchrec_topology,
        batch_size=batch_size,
        enumerator=_TimedEnumerator(
            topology=torchrec_topology, batch_size=batch_size, constraints=constraints
        ),
        constraints=constraints,
        proposer=GreedyProposer() if proposer == "greedy" else None,
        debug=False,
        timeout_seconds=timeout_seconds,
    )
    start = time.perf_counter()
    with quiet_torchrec_planner():
        plan = planner.plan(module, [AllShardingTypesEBCSharder()])
    end = time.perf_counter()
    search = end - (enumerated_at[-1] if enumerated_at else start)
    return TorchrecPlanning(
        plan=plan,
        seconds=end - start,
        search_seconds=search,
        num_proposals=planner._num_proposals,
        timed_out=timeout_seconds is not None and search > timeout_seconds,
    )
