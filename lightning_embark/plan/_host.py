"""Plans derived from a plan: one host's tower plan, and a plan restricted to some tables."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from lightning_embark.errors import ConfigError
from lightning_embark.plan._types import Plan, TableLayout


def host_plan(plan: Plan, host: int) -> Plan:
    """The plan the ranks of ``host`` execute among themselves for its towers' tables.

    Same clusters and layouts, ranks counted inside the host (global rank ``host * L +
    l`` becomes ``l``), a world of ``L`` ranks on one host, no towers.
    """
    tables = {t for tower in plan.towers if tower.host == host for t in tower.tables}
    base = host * plan.ranks_per_host
    layouts = tuple(
        TableLayout(
            table=t.table,
            cluster=t.cluster,
            num_replicas=t.num_replicas,
            num_row_shards=t.num_row_shards,
            num_col_shards=t.num_col_shards,
            row_split=t.row_split,
            ranks=tuple(tuple(r - base for r in group) for group in t.ranks),
        )
        for t in plan.tables
        if t.table in tables
    )
    used = {t.cluster for t in layouts}
    return Plan(
        world_size=plan.ranks_per_host,
        ranks_per_host=plan.ranks_per_host,
        clusters=tuple(c for c in plan.clusters if c.name in used),
        tables=layouts,
    )


def restrict(plan: Plan, tables: Iterable[str]) -> Plan:
    """``plan`` for a model holding only ``tables`` (one collection of several).

    Keeps the clusters as they are, the layouts in the order of ``tables`` and the
    towers whose tables are all kept; a tower split between the kept tables and others
    is an error (its output could not be assembled by one module).
    """
    order = list(tables)
    kept = set(order)
    towers = []
    for tower in plan.towers:
        inside = [t for t in tower.tables if t in kept]
        if not inside:
            continue
        if len(inside) != len(tower.tables):
            outside = [t for t in tower.tables if t not in kept]
            raise ConfigError(
                f"tower {tower.name!r} holds tables {inside} of this collection and {outside} "
                "of another; a tower's tables must be in one EmbeddingBagCollection"
            )
        towers.append(tower)
    return dataclasses.replace(
        plan, tables=tuple(plan.layout(t) for t in order), towers=tuple(towers)
    )
