"""One layout of the greedy planner: the DP tables, then every other table split and placed.

:class:`~lightning_embark.planner._greedy.GreedyPlanner` searches over load targets,
tunes each layout's exchanges and falls back when nothing fits; what it lays out for one
target lives here, apart from that search, so each reads on its own:

* :func:`choose_dp`: the tables replicated on every rank (cheapest first, within the DP
  memory budget, and only when their shared all-reduce pays for itself).
* :func:`plan_once`: per remaining table the cheapest ``(k, c)`` split under the load
  target and the memory cap, then its blocks, largest first, on the least-loaded rank
  (row shards of a column shard on the least-loaded host), as a :class:`~lightning_embark.
  plan.Plan` before any exchange tuning.

Both iterate in a fixed order, so layouts are deterministic.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from lightning_embark.errors import PlanInfeasibleError
from lightning_embark.plan import (
    ClusterPlan,
    ClusterType,
    Plan,
    RowSplit,
    TableLayout,
)
from lightning_embark.planner._cost import CostModel
from lightning_embark.planner._greedy_config import GreedyConfig
from lightning_embark.planner._placement import Placer, size_text
from lightning_embark.planner._split import Candidates, Shape, Split, dp_seconds, split_cost


def choose_dp(
    model: CostModel,
    shape: Shape,
    kinds: Sequence[ClusterType],
    capacity: float,
    config: GreedyConfig,
) -> set[int]:
    """Tables replicated everywhere: cheapest first while within the DP memory budget.

    Args:
        model: The cost model being planned for.
        shape: The scalar-cost shape of the cluster.
        kinds: Each table's cluster type, in spec order.
        capacity: Bytes per rank for weights and optimizer state
            (``config.memory_fraction`` of its memory).
        config: The planner's knobs (``dp``, ``dp_fraction``, ``memory_fraction``).
    """
    if not config.dp or model.world == 1:
        return set()
    budget = (
        capacity * config.dp_fraction / config.memory_fraction if np.isfinite(capacity) else np.inf
    )
    gains = []
    for i, load in enumerate(model.loads):
        sharded = split_cost(load, kinds[i], 1, 1, shape, False).total / model.world
        saving = sharded - dp_seconds(load, shape)
        if saving > 0:
            gains.append((-saving, i))
    chosen, used, saved = set(), 0.0, 0.0
    for gain, i in sorted(gains):
        size = shape.element_bytes(model.loads[i].rows, model.loads[i].dim)
        if used + size <= budget:
            chosen.add(i)
            used += size
            saved -= gain
    # the DP tables share one all-reduce per step: it must pay for its fixed cost
    return chosen if saved > model.terms.allreduce_latency() else set()


def plan_once(
    model: CostModel,
    shape: Shape,
    kinds: Sequence[ClusterType],
    dp: set[int],
    candidates: dict[int, Candidates],
    *,
    target: float,
    capacity: float,
    hier: bool,
) -> Plan:
    """The layout for one load target: DP tables replicated, the others split and placed.

    Raises:
        PlanInfeasibleError: a table has no split whose blocks fit what a rank has left
            for shards; names the table and the shortfall.
    """
    spec, world = model.spec, model.world
    dp_bytes = sum(shape.element_bytes(model.loads[i].rows, model.loads[i].dim) for i in dp)
    placer = Placer(
        num_hosts=model.num_hosts,
        ranks_per_host=model.ranks_per_host,
        capacity=capacity - dp_bytes,
    )
    splits: dict[int, Split] = {}
    for i, load in enumerate(model.loads):
        if i in dp:
            continue
        split = candidates[i].choose(target=target, cap=capacity - dp_bytes)
        if split is None:
            smallest = candidates[i].smallest_block_bytes()
            raise PlanInfeasibleError(
                f"table {spec.tables[i].name!r} does not fit: even split over up to "
                f"{min(world, load.rows)} ranks a shard needs {size_text(smallest)} but a "
                f"rank has {size_text(capacity - dp_bytes)} for shards (short by "
                f"{size_text(smallest - capacity + dp_bytes)}); add ranks or memory, or cap "
                "rows with --max-rows",
                table=spec.tables[i].name,
                shortfall_bytes=smallest - capacity + dp_bytes,
            )
        splits[i] = split
    order = sorted(splits, key=lambda i: (-splits[i].block * splits[i].k * splits[i].c, i))
    layouts: dict[int, TableLayout] = {}
    for i in order:
        s, name = splits[i], spec.tables[i].name
        cluster = kinds[i].value + ("_rows" if (kinds[i] is ClusterType.RB and s.k > 1) else "")
        ranks = placer.place(
            name, k=s.k, c=s.c, load=s.block, size=s.block_bytes, by_host=hier and s.k > 1
        )
        layouts[i] = TableLayout(
            table=name,
            cluster=cluster,
            num_row_shards=s.k,
            num_col_shards=s.c,
            row_split=RowSplit.RANGE if s.k > 1 else RowSplit.HASH,
            ranks=(tuple(ranks),),
        )
    for i in dp:
        layouts[i] = TableLayout(
            table=spec.tables[i].name,
            cluster="dp",
            num_replicas=world,
            ranks=tuple((r,) for r in range(world)),
        )
    used = {layout.cluster for layout in layouts.values()}
    clusters = tuple(
        ClusterPlan(name=name, type=ClusterType(name.split("_")[0]))
        for name in ("dp", "rb", "rb_rows", "ub")
        if name in used
    )
    return Plan(
        world_size=world,
        ranks_per_host=model.ranks_per_host,
        clusters=clusters,
        tables=tuple(layouts[i] for i in range(len(spec.tables))),
    )
