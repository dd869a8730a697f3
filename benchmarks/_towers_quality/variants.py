"""The towered models compared with flat, and the towers each one trains with.

A variant is a tower module, its ratio, a number of towers and a partition:

* ``learned``: the partitioner over the affinity of the flat model of the same seed after
  its warm-up steps (``embark-towers``' method), planned for 2 hosts x 2 ranks;
* ``statistics``: the partitioner without affinity (balanced estimated costs, what
  ``towers=N`` plans);
* ``random``: the tables shuffled over the learned towers' sizes (a partition the
  learned one must beat to be worth learning).

The wire ratio of a variant is ``sum_t D_t / sum_t O_t``: the pooled values its towers
replace over the values they send instead (the factor by which the towers shrink what
crosses hosts for their features, forward and backward).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from lightning_embark.plan import TowerModule, TowerRequest
from lightning_embark.planner import (
    CostModel,
    FeatureAffinity,
    kept_affinity,
    load_calibration,
    partition_tables,
)
from lightning_embark.spec import ModelSpec

PARTITIONS = ("learned", "statistics", "random")
#: The cluster the partitioner balances towers for.
HOSTS, RANKS_PER_HOST = 2, 2


@dataclass(frozen=True, kw_only=True)
class Variant:
    """One towered model.

    Attributes:
        label: Its name in tables and JSON.
        module: The tower module.
        ratio: ``output_ratio`` of every tower.
        partition: ``learned``, ``statistics`` or ``random``.
        towers: How many towers.
    """

    label: str
    module: TowerModule
    ratio: float
    partition: str = "learned"
    towers: int = HOSTS


DOT, PROJECTION, DCN = TowerModule.DOT, TowerModule.PROJECTION, TowerModule.DCN
VARIANTS: tuple[Variant, ...] = (
    Variant(label="dot r4", module=DOT, ratio=4.0),
    Variant(label="dot r4 statistics-only", module=DOT, ratio=4.0, partition="statistics"),
    Variant(label="dot r4 random", module=DOT, ratio=4.0, partition="random"),
    Variant(label="dot r2", module=DOT, ratio=2.0),
    Variant(label="dot r4 4 towers", module=DOT, ratio=4.0, towers=2 * HOSTS),
    Variant(label="dot r4 8 towers", module=DOT, ratio=4.0, towers=4 * HOSTS),
    Variant(label="projection r4", module=PROJECTION, ratio=4.0),
    Variant(label="dcn r4", module=DCN, ratio=4.0),
)
BY_LABEL = {v.label: v for v in VARIANTS}


def towers_for(
    variant: Variant,
    spec: ModelSpec,
    batch_size: int,
    affinity: FeatureAffinity | None,
    seed: int,
) -> list[TowerRequest]:
    """The towers ``variant`` trains with (``affinity``: the flat warm-up's)."""
    model = CostModel(
        spec,
        load_calibration("emulated"),
        num_hosts=HOSTS,
        ranks_per_host=RANKS_PER_HOST,
        batch_size=batch_size,
    )
    learned = variant.partition in ("learned", "random")
    towers = partition_tables(
        model,
        variant.towers,
        affinity=affinity if learned else None,
        seed=seed,
        module=variant.module,
        output_ratio=variant.ratio,
    )
    return shuffled(towers, seed) if variant.partition == "random" else towers


def shuffled(towers: Sequence[TowerRequest], seed: int) -> list[TowerRequest]:
    """Towers of the same sizes, modules and widths over a random order of the tables."""
    tables = [t for tower in towers for t in tower.tables]
    random.Random(1000 + seed).shuffle(tables)
    out, start = [], 0
    for tower in towers:
        size = len(tower.tables)
        out.append(dataclasses.replace(tower, tables=tuple(tables[start : start + size])))
        start += size
    return out


def wire_ratio(towers: Sequence[TowerRequest], spec: ModelSpec) -> float:
    """``sum_t D_t / sum_t O_t`` of ``towers`` (see the module docstring)."""
    dims = {t.name: t.embedding_dim for t in spec.tables}
    pooled = sent = 0
    for tower in towers:
        widths = [dims[t] for t in tower.tables]
        out = tower.output_width(widths)
        pooled += sum(widths)
        sent += sum(widths) if out is None else out
    return pooled / sent


def kept(towers: Sequence[TowerRequest], affinity: FeatureAffinity) -> float:
    """The share of ``affinity`` that ``towers`` keep inside a tower."""
    names = [t for tower in towers for t in tower.tables]
    index = {name: i for i, name in enumerate(names)}
    groups = [[index[t] for t in tower.tables] for tower in towers]
    return kept_affinity(np.asarray(affinity.over(names)), groups)
