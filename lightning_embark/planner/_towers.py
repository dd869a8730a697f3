"""Planning with towers: which tables form towers, on which host, laid out how.

:func:`plan_with_towers` turns tower requests (tables, module, output width, maybe a
host) into a :class:`~lightning_embark.plan.Plan`: the flat tables are planned by the
greedy planner over the whole world first; each tower without a host goes to the host
with the least tower cost so far among those whose ranks can still hold it; each
host's tower tables are then planned by the same greedy planner as a one-host world of
``L`` ranks serving ``H * B`` samples (what arrives there), in the memory the flat
tables left on that host's fullest rank. Every candidate is thus valid by
construction, and the plan's estimate prices the towers (:mod:`._tower_cost`).

:func:`table_costs` is each table's load on a tower host, which the partitioner
(:mod:`._partition`) balances.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

import numpy as np

from lightning_embark.errors import ConfigError, PlanInfeasibleError
from lightning_embark.plan import (
    ClusterPlan,
    ClusterType,
    Plan,
    TowerRequest,
)
from lightning_embark.planner._cost import CostModel
from lightning_embark.planner._greedy import GreedyPlanner
from lightning_embark.planner._greedy_config import PlanResult

GIB = 2**30


def table_costs(model: CostModel, tables: Sequence[str]) -> dict[str, float]:
    """Seconds per step of each table alone, row-split over one host serving ``H * B``
    samples: the load a tower of it puts on its host."""
    inner = _host_model(model, tables, memory=None)
    cluster = ClusterPlan(name="probe", type=ClusterType.RB)
    group = (tuple(range(model.ranks_per_host)),)
    costs = {}
    for name in tables:
        terms = inner.table_terms(inner.index[name], cluster, model.ranks_per_host, 1, group)
        costs[name] = float(inner.step_seconds(terms, 0.0).max())
    return costs


def plan_with_towers(
    model: CostModel, towers: Sequence[TowerRequest], planner: GreedyPlanner | None = None
) -> PlanResult:
    """A plan with ``towers`` on ``model``'s cluster (see the module docstring).

    Raises:
        ConfigError: a tower names an unknown table, a table is in two towers, a host
            is out of range.
        PlanInfeasibleError: a host's towers do not fit the memory the flat tables left
            there (names the towers, the host and the shortfall).
    """
    start = time.perf_counter()
    planner = planner or GreedyPlanner()
    # Towers are planned within HBM: a host's tower tables get no UVM caches (the host
    # memory the flat tables' caches use is not tracked per host yet).
    host_planner = GreedyPlanner(dataclasses.replace(planner.config, uvm_caching=False))
    spec, hosts, local = model.spec, model.num_hosts, model.ranks_per_host
    known = {t.name: t for t in spec.tables}
    owner: dict[str, str] = {}
    for tower in towers:
        for table in tower.tables:
            if table not in known:
                raise ConfigError(
                    f"tower {tower.name!r} names table {table!r}, which spec {spec.name!r} does "
                    f"not have (tables: {sorted(known)})"
                )
            if table in owner:
                raise ConfigError(
                    f"table {table!r} is in towers {owner[table]!r} and {tower.name!r}"
                )
            owner[table] = tower.name
        if tower.host is not None and not 0 <= tower.host < hosts:
            raise ConfigError(
                f"tower {tower.name!r} asks for host {tower.host}, outside 0..{hosts - 1}"
            )
    flat_names = [t.name for t in spec.tables if t.name not in owner]
    flat = _flat_plan(model, flat_names, planner)
    used = _memory_per_rank(model, flat)
    hosts_of = _choose_hosts(model, towers, used)
    clusters, layouts = list(flat.clusters), {t.table: t for t in flat.tables}
    widths = {t.name: t.embedding_dim for t in spec.tables}
    planned_towers = []
    for host in range(hosts):
        mine = [t for t in towers if hosts_of[t.name] == host]
        if not mine:
            continue
        names = [n for t in mine for n in t.tables]
        ranks = range(host * local, (host + 1) * local)
        memory = (
            None
            if model.calib.memory_per_rank is None
            else model.calib.memory_per_rank - max(used[r] for r in ranks)
        )
        try:
            sub = host_planner.plan(_host_model(model, names, memory=memory)).plan
        except PlanInfeasibleError as error:
            raise PlanInfeasibleError(
                f"towers {[t.name for t in mine]} do not fit host {host}: {error} (the flat "
                f"tables leave {(memory or 0) / GIB:.2f} GiB per rank there); give the towers "
                "fewer tables, keep large tables flat or spread the towers over more hosts",
                table=error.table,
                shortfall_bytes=error.shortfall_bytes,
            ) from error
        prefix = f"h{host}-"
        clusters += [dataclasses.replace(c, name=prefix + c.name) for c in sub.clusters]
        for t in sub.tables:
            layouts[t.table] = dataclasses.replace(
                t,
                cluster=prefix + t.cluster,
                ranks=tuple(tuple(r + host * local for r in g) for g in t.ranks),
            )
        planned_towers += [t.resolved([widths[n] for n in t.tables], host) for t in mine]
    order = {t.name: i for i, t in enumerate(towers)}
    plan = Plan(
        world_size=model.world,
        ranks_per_host=local,
        clusters=tuple(clusters),
        tables=tuple(layouts[t.name] for t in spec.tables),
        towers=tuple(sorted(planned_towers, key=lambda t: order[t.name])),
    )
    estimate = model.estimate(plan)
    notes = tuple(
        f"tower {t.name} on host {t.host}: {len(t.tables)} table(s), {t.module.value}"
        + ("" if t.output_dim is None else f" -> {t.output_dim} wide")
        for t in plan.towers
    )
    return PlanResult(
        plan=plan,
        estimate=estimate,
        planning_seconds=time.perf_counter() - start,
        notes=notes,
    )


def _subspec_model(
    model: CostModel, names: Sequence[str], *, hosts: int, batch: int, memory: float | None
) -> CostModel:
    keep = set(names)
    spec = dataclasses.replace(
        model.spec, tables=tuple(t for t in model.spec.tables if t.name in keep)
    )
    calib = (
        model.calib if memory is None else dataclasses.replace(model.calib, memory_per_rank=memory)
    )
    return CostModel(
        spec,
        calib,
        num_hosts=hosts,
        ranks_per_host=model.ranks_per_host,
        batch_size=batch,
        stats=model.stats,
    )


def _host_model(model: CostModel, names: Sequence[str], *, memory: float | None) -> CostModel:
    """The cost model of one host's tower tables: ``L`` ranks serving ``H * B`` samples."""
    return _subspec_model(
        model, names, hosts=1, batch=model.num_hosts * model.batch_size, memory=memory
    )


def _flat_plan(model: CostModel, names: Sequence[str], planner: GreedyPlanner) -> Plan:
    """The greedy plan of the flat tables over the world (an empty plan when none)."""
    if not names:
        return Plan(
            world_size=model.world, ranks_per_host=model.ranks_per_host, clusters=(), tables=()
        )
    sub = _subspec_model(model, names, hosts=model.num_hosts, batch=model.batch_size, memory=None)
    return planner.plan(sub).plan


def _memory_per_rank(model: CostModel, flat: Plan) -> list[float]:
    """Bytes the flat plan holds on each rank (weights, state, buffers), by the model."""
    if not flat.tables:
        return [0.0] * model.world
    names = [t.table for t in flat.tables]
    sub = _subspec_model(model, names, hosts=model.num_hosts, batch=model.batch_size, memory=None)
    return [r.memory_bytes for r in sub.estimate(flat).per_rank]


def _choose_hosts(
    model: CostModel, towers: Sequence[TowerRequest], used: list[float]
) -> dict[str, int]:
    """Each tower's host: the one asked for, else the cheapest host so far whose ranks
    can still hold the tower's weights (costliest tower first)."""
    local, hosts = model.ranks_per_host, model.num_hosts
    all_tables = [n for t in towers for n in t.tables]
    costs = table_costs(model, all_tables) if all_tables else {}
    sizes = {t.name: t.num_embeddings * t.embedding_dim for t in model.spec.tables}
    capacity = model.calib.memory_per_rank
    load = [0.0] * hosts
    free = [
        np.inf
        if capacity is None
        else sum(capacity - used[r] for r in range(h * local, (h + 1) * local))
        for h in range(hosts)
    ]
    chosen: dict[str, int] = {}
    for tower in towers:
        if tower.host is not None:
            chosen[tower.name] = tower.host
            load[tower.host] += sum(costs[n] for n in tower.tables)
            free[tower.host] -= sum(sizes[n] for n in tower.tables) * model.calib.weight_bytes
    pending = sorted(
        (t for t in towers if t.host is None), key=lambda t: -sum(costs[n] for n in t.tables)
    )
    for tower in pending:
        need = sum(sizes[n] for n in tower.tables) * model.calib.weight_bytes
        fitting = [h for h in range(hosts) if free[h] >= need] or list(range(hosts))
        host = min(fitting, key=lambda h: (load[h], h))
        chosen[tower.name] = host
        load[host] += sum(costs[n] for n in tower.tables)
        free[host] -= need
    return chosen
