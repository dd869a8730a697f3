"""Planning with towers: which tables form towers, on which host, laid out how.

:func:`plan_with_towers` turns tower requests (tables, module, output width, maybe a
host) into a :class:`~lightning_embark.plan.Plan`: the flat tables are planned by the
greedy planner over the whole world first; each tower without a host goes to the host
with the least tower cost so far among those whose ranks can still hold it; each
host's tower tables are then planned by the same greedy planner as a one-host world of
``L`` ranks serving ``H * B`` samples (what arrives there), in the memory the flat
tables left on that host's fullest rank. Every candidate is thus valid by
construction, and the plan's estimate prices the towers (:mod:`._tower_cost`).

:func:`partition_tables` is the statistics-only tower partitioner: it spreads the
tables into ``count`` towers so that their estimated costs balance (longest cost
first, onto the cheapest tower so far: within ``4/3`` of the optimal maximum, the
LPT bound), leaving flat the tables too large for one host. It knows nothing of which
features interact; a partitioner that learns that from a warm-up run can replace it
through the same requests. :func:`resolve_towers` reads the forms a user gives towers
in (a count, ``"auto"``, a ``towers.json``) into requests.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from lightning_embark.errors import ConfigError, PlanInfeasibleError
from lightning_embark.plan import (
    ClusterPlan,
    ClusterType,
    Compression,
    Plan,
    TowerModule,
    TowerRequest,
    load_towers,
)
from lightning_embark.planner._cost import CostModel
from lightning_embark.planner._greedy import GreedyPlanner, PlanResult

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


def partition_tables(
    model: CostModel,
    count: int,
    *,
    module: TowerModule = TowerModule.IDENTITY,
    output_ratio: float | None = None,
    compression: Compression = Compression.FP32,
) -> list[TowerRequest]:
    """``count`` towers with balanced estimated cost (see the module docstring).

    Tables whose weights alone exceed a host's memory stay flat. Deterministic: ties
    go to the lower tower index and tables of equal cost keep the spec's order.

    Raises:
        ConfigError: ``count`` is not positive.
    """
    if not isinstance(count, int) or count < 1:
        raise ConfigError(f"tower count must be a positive integer, got {count!r}")
    calib = model.calib
    host_memory = (
        None if calib.memory_per_rank is None else calib.memory_per_rank * model.ranks_per_host
    )
    fits = [
        t.name
        for t in model.spec.tables
        if host_memory is None
        or t.num_embeddings * t.embedding_dim * calib.weight_bytes <= host_memory
    ]
    costs = table_costs(model, fits)
    order = sorted(fits, key=lambda n: -costs[n])
    members: list[list[str]] = [[] for _ in range(count)]
    load = [0.0] * count
    for name in order:
        i = int(np.argmin(load))
        members[i].append(name)
        load[i] += costs[name]
    rank = {t.name: i for i, t in enumerate(model.spec.tables)}
    ratio = None if module is TowerModule.IDENTITY else output_ratio
    return [
        TowerRequest(
            name=f"tower{i}",
            tables=tuple(sorted(m, key=rank.__getitem__)),
            module=module,
            output_ratio=ratio,
            forward_compression=compression,
            backward_compression=compression,
        )
        for i, m in enumerate(members)
        if m
    ]


def resolve_towers(
    model: CostModel,
    towers: int | str | Path | Sequence[TowerRequest],
    *,
    module: TowerModule = TowerModule.IDENTITY,
    output_ratio: float | None = None,
    compression: Compression = Compression.FP32,
) -> list[TowerRequest]:
    """Tower requests from what a user wrote: a count (also as digits, as a command
    line gives it) or ``"auto"`` (one tower per host) partitioned by
    :func:`partition_tables` with ``module`` / ``output_ratio`` / ``compression``; a
    ``towers.json`` path or requests as they are.

    Raises:
        ConfigError: a string that is neither ``"auto"`` nor an existing file; tower
            module options given with a towers file (which says its own modules).
    """
    if towers == "auto":
        towers = model.num_hosts
    elif isinstance(towers, str) and towers.isdigit():
        towers = int(towers)
    if not isinstance(towers, int | str | Path):
        return list(towers)
    if isinstance(towers, int):
        return partition_tables(
            model, towers, module=module, output_ratio=output_ratio, compression=compression
        )
    if not Path(towers).is_file():
        raise ConfigError(
            f"towers {str(towers)!r} is neither 'auto', a tower count nor an existing "
            "towers.json file"
        )
    if module is not TowerModule.IDENTITY or output_ratio is not None:
        raise ConfigError(
            f"towers file {str(towers)!r} names each tower's module and width; drop the tower "
            f"module options ({module.value}, ratio {output_ratio})"
        )
    return load_towers(towers)


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
            sub = planner.plan(_host_model(model, names, memory=memory)).plan
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
        planned_towers += [t.resolved(sum(widths[n] for n in t.tables), host) for t in mine]
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
