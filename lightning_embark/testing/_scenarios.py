"""Small synthetic scenarios for exactness checks: every layout in one plan, jagged batches.

The engine's acceptance checks (tests, ``embark-bench`` sanity runs) compare the
sharded module with one unsharded ``EmbeddingBagCollection`` fed the global batch.
:func:`all_layouts_plan` puts one table per layout of docs/architecture.md#3d-sharding into one
cluster (plus a data-parallel table), and :func:`random_batches` draws each rank's
local batch with the edge cases that break sharded lookups: empty bags, duplicate
IDs, the last row, and ranks with no samples.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from lightning_embark.engine import jagged_by_key
from lightning_embark.plan import (
    ClusterPlan,
    ClusterType,
    Compression,
    Plan,
    RowSplit,
    TableLayout,
    layouts,
)


@dataclass(frozen=True, kw_only=True)
class Scenario:
    """Tables (torchrec configs) and a plan that lays them out."""

    tables: list[EmbeddingBagConfig]
    plan: Plan

    @property
    def keys(self) -> list[str]:
        return [f for t in self.tables for f in t.feature_names]

    def rows_of(self, key: str) -> int:
        return next(t.num_embeddings for t in self.tables if key in t.feature_names)


def all_layouts_plan(
    world_size: int,
    ranks_per_host: int,
    cluster_type: ClusterType | str,
    *,
    forward: Compression | str = Compression.FP32,
    backward: Compression | str = Compression.FP32,
    hierarchical: bool = False,
    weighted: bool = False,
) -> Scenario:
    """One table per layout in one ``cluster_type`` cluster, plus a DP table.

    Layouts: table-wise, row-wise hash, row-wise range, column-wise, grid, table-row-wise
    (the last host's ranks), 2 replicas (one per half of the world, row-split inside it
    when a half has several ranks), 2 replicas x column shards (4+ ranks), a table read by
    two features, and data-parallel. Mean pooling on two features unless ``weighted``.
    """
    world, local = world_size, ranks_per_host
    hosts = world // local
    half = max(1, world // 2)
    groups = [list(range(half)), list(range(half, 2 * half))] if world > 1 else [[0]]
    name = "main"
    mean = PoolingType.SUM if weighted else PoolingType.MEAN
    specs: list[tuple[str, int, int, PoolingType, TableLayout, list[str] | None]] = [
        ("tw", 20, 8, PoolingType.SUM, layouts.table_wise("tw", name, world - 1), None),
        ("rwh", 23, 8, mean, layouts.row_wise("rwh", name, range(world)), None),
        (
            "rwr",
            26,
            8,
            PoolingType.SUM,
            layouts.row_wise("rwr", name, range(world), RowSplit.RANGE),
            None,
        ),
        (
            "cw",
            15,
            4 * world,
            PoolingType.SUM,
            layouts.column_wise("cw", name, range(world)),
            None,
        ),
        ("grid", 31, 16, PoolingType.SUM, layouts.grid("grid", name, _grid_ranks(world)), None),
        (
            "twrw",
            19,
            8,
            PoolingType.SUM,
            layouts.table_row_wise("twrw", name, hosts - 1, local),
            None,
        ),
        (
            "rep",
            17,
            8,
            PoolingType.SUM,
            layouts.replicated("rep", name, groups, num_row_shards=half),
            None,
        ),
        (
            "pair",
            29,
            8,
            PoolingType.SUM,
            layouts.row_wise("pair", name, range(world)),
            ["pair_a", "pair_b"],
        ),
        ("dp", 9, 8, mean, layouts.data_parallel("dp", "dp", world), None),
    ]
    if half > 1:
        specs.insert(
            7,
            (
                "repcw",
                13,
                8,
                PoolingType.SUM,
                layouts.replicated("repcw", name, groups, num_col_shards=half),
                None,
            ),
        )
    tables = [
        EmbeddingBagConfig(
            name=f"t_{n}",
            num_embeddings=rows,
            embedding_dim=dim,
            feature_names=features or [n],
            pooling=pool,
        )
        for n, rows, dim, pool, _, features in specs
    ]
    clusters = (
        ClusterPlan(
            name=name,
            type=ClusterType(cluster_type),
            forward_compression=Compression(forward),
            backward_compression=Compression(backward),
            hierarchical=hierarchical,
        ),
        ClusterPlan(name="dp", type=ClusterType.DP),
    )
    plan = Plan(
        world_size=world,
        ranks_per_host=local,
        clusters=clusters,
        tables=tuple(s[4] for s in specs),
    )
    return Scenario(tables=tables, plan=plan)


def _grid_ranks(world: int) -> list[list[int]]:
    if world == 1:
        return [[0, 0], [0, 0]]
    if world == 2:
        return [[0, 1], [1, 0]]
    return [[0, 1], [2, 3]]


def random_batches(
    scenario: Scenario,
    batch_sizes: Sequence[int],
    *,
    seed: int,
    max_length: int = 4,
    weighted: bool = False,
) -> list[KeyedJaggedTensor]:
    """One local batch per rank (``batch_sizes[r]`` samples; 0 allowed), same on every rank.

    About a quarter of the bags are empty, IDs repeat inside bags and across ranks,
    and every feature's last row appears whenever the rank has a non-empty bag.
    """
    g = torch.Generator().manual_seed(seed)
    out = []
    for size in batch_sizes:
        values, lengths, weights = [], [], []
        for key in scenario.keys:
            rows = scenario.rows_of(key)
            length = torch.randint(0, max_length + 1, (size,), generator=g)
            length[torch.rand(size, generator=g) < 0.25] = 0
            ids = torch.randint(
                0, max(1, rows // 3), (int(length.sum()),), generator=g
            )  # duplicates
            if ids.numel():
                ids[0] = rows - 1
            values.append(ids)
            lengths.append(length)
            weights.append(torch.rand(ids.numel(), generator=g) + 0.5)
        out.append(
            KeyedJaggedTensor(
                keys=scenario.keys,
                values=torch.cat(values),
                lengths=torch.cat(lengths),
                weights=torch.cat(weights) if weighted else None,
                stride=size,
            )
        )
    return out


def concat_batches(batches: Sequence[KeyedJaggedTensor]) -> KeyedJaggedTensor:
    """The global batch: every rank's local samples, in rank order, per feature."""
    keys = batches[0].keys()
    parts = [jagged_by_key(b) for b in batches]
    values, lengths, weights = [], [], []
    for key in keys:
        for part in parts:
            v, n, w = part[key]
            values.append(v)
            lengths.append(n)
            if w is not None:
                weights.append(w)
    return KeyedJaggedTensor(
        keys=keys,
        values=torch.cat(values),
        lengths=torch.cat(lengths),
        weights=torch.cat(weights) if weights else None,
        stride=sum(b.stride() for b in batches),
    )


#: ``embark-bench`` arguments of the smallest run that still crosses hosts: the
#: demo-small spec capped at 2,000 rows, 2 emulated hosts of 1 rank, 3 steps of 32
#: samples after 1 warm-up, a one-layer dense part. End-to-end tests add
#: ``--strategies`` and ``--out``.
TINY_BENCH_ARGS: tuple[str, ...] = (
    "--model",
    "demo-small",
    "--max-rows",
    "2000",
    "--hosts",
    "2",
    "--ranks-per-host",
    "1",
    "--batch-size",
    "32",
    "--steps",
    "3",
    "--warmup",
    "1",
    "--interaction",
    "dot",
    "--dense-arch",
    "16",
    "--over-arch",
    "32,1",
)
