"""The check's model: a few tables in every cluster type, their batches and the oracle.

Built from torch alone (the check runs where torchrec is not installed). One engine holds:

========  =========  ====================  =====================================
table     cluster    layout                wire (forward / backward)
========  =========  ====================  =====================================
``dp``    ``dp``     data parallel         (all-reduce of fp32 gradients)
``tw``    ``rb``     one rank              fp32 / fp32
``rw``    ``rb``     row-wise (all ranks)  fp32 / fp32
``cw``    ``rb``     column-wise           fp32 / fp32
``ub``    ``ub``     row-wise              fp32 / fp32
``h16``   ``rb16``   row-wise              fp16 / bf16 (hierarchical on 2+ hosts)
``u8``    ``ub8``    table-wise            int8 / bf16
========  =========  ====================  =====================================

With ``W`` ranks of one rank per host each cluster exchanges across "hosts", so the
hierarchical path runs too. The oracle pools every feature over the global batch in
float64 from the same initial weights and applies SGD by hand.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from lightning_embark.engine import FeatureBatch, TableConfig
from lightning_embark.plan import (
    ClusterPlan,
    ClusterType,
    Compression,
    Plan,
    RowSplit,
    TableLayout,
    layouts,
)

#: Exchanged cluster -> (type, forward, backward compression, hierarchical when W > 1).
CLUSTERS: dict[str, tuple[ClusterType, Compression, Compression, bool]] = {
    "rb": (ClusterType.RB, Compression.FP32, Compression.FP32, False),
    "ub": (ClusterType.UB, Compression.FP32, Compression.FP32, False),
    "rb16": (ClusterType.RB, Compression.FP16, Compression.BF16, True),
    "ub8": (ClusterType.UB, Compression.INT8, Compression.BF16, False),
}
#: Table -> (rows, width, pooling, cluster, layout kind).
TABLES: dict[str, tuple[int, int, str, str, str]] = {
    "dp": (11, 8, "mean", "dp", "dp"),
    "tw": (37, 16, "sum", "rb", "tw"),
    "rw": (53, 16, "sum", "rb", "rw"),
    "cw": (29, 32, "sum", "rb", "cw"),
    "ub": (19, 16, "sum", "ub", "rw"),
    "h16": (61, 32, "sum", "rb16", "rw"),
    "u8": (23, 16, "mean", "ub8", "tw"),
}
#: The clusters the timings time, one table type each: DP, RB, UB.
TIMED = {"dp": ("dp",), "rb": ("tw", "rw", "cw"), "ub": ("ub",)}
LEARNING_RATE = 0.05


@dataclass(frozen=True, kw_only=True)
class Scenario:
    """The tables, the plan for ``W`` ranks, initial weights and every rank's batch."""

    tables: list[TableConfig]
    plan: Plan
    weights: dict[str, torch.Tensor]
    batches: list[dict[str, FeatureBatch]]
    grads: list[torch.Tensor]


def build(world: int, *, batch: int, seed: int = 0, only: tuple[str, ...] = ()) -> Scenario:
    """The scenario for ``world`` ranks of ``batch`` samples each (CPU tensors).

    Args:
        only: Tables to keep (default all); the plan keeps the clusters they use.
    """
    names = [n for n in TABLES if not only or n in only]
    generator = torch.Generator().manual_seed(seed)
    tables = [
        TableConfig(
            name=f"t_{n}",
            num_embeddings=TABLES[n][0],
            embedding_dim=TABLES[n][1],
            feature_names=(n,),
            pooling=TABLES[n][2],
        )
        for n in names
    ]
    used = {TABLES[n][3] for n in names}
    clusters = [ClusterPlan(name="dp", type=ClusterType.DP)] if "dp" in used else []
    for name, (kind, forward, backward, hierarchical) in CLUSTERS.items():
        if name in used:
            clusters.append(
                ClusterPlan(
                    name=name,
                    type=kind,
                    forward_compression=forward,
                    backward_compression=backward,
                    hierarchical=hierarchical and world > 1,
                )
            )
    plan = Plan(
        world_size=world,
        ranks_per_host=1,
        clusters=tuple(clusters),
        tables=tuple(_layout(n, world) for n in names),
    )
    weights = {
        t.name: (torch.rand(t.num_embeddings, t.embedding_dim, generator=generator) - 0.5)
        for t in tables
    }
    batches, grads = [], []
    width = sum(t.embedding_dim for t in tables)
    for _ in range(world):
        mine = {}
        for t in tables:
            lengths = torch.randint(0, 5, (batch,), generator=generator)
            ids = torch.randint(0, t.num_embeddings, (int(lengths.sum()),), generator=generator)
            mine[t.feature_names[0]] = FeatureBatch(values=ids, lengths=lengths)
        batches.append(mine)
        grads.append(torch.randn(batch, width, generator=generator))
    return Scenario(tables=tables, plan=plan, weights=weights, batches=batches, grads=grads)


def _layout(name: str, world: int) -> TableLayout:
    _, _, _, cluster, kind = TABLES[name]
    table = f"t_{name}"
    if kind == "dp":
        return layouts.data_parallel(table, cluster, world)
    if kind == "tw":
        return layouts.table_wise(table, cluster, world - 1)
    if kind == "cw":
        return layouts.column_wise(table, cluster, range(world))
    return layouts.row_wise(table, cluster, range(world), RowSplit.RANGE)


@dataclass(frozen=True, kw_only=True)
class Oracle:
    """The unsharded result in float64: pooled outputs (global batch, rank order),
    updated tables, and the magnitudes the tolerances scale with."""

    pooled: torch.Tensor
    pooled_magnitude: torch.Tensor
    max_bag: int
    tables: dict[str, torch.Tensor]
    grad_magnitude: dict[str, torch.Tensor]
    max_count: int


def oracle(scenario: Scenario) -> Oracle:
    """One unsharded step on the global batch: ``loss = sum(out * g)``, SGD."""
    parts, magnitudes, updated, grad_magnitude = [], [], {}, {}
    max_bag = max_count = 0
    g_all = torch.cat(scenario.grads).to(torch.float64)
    column = 0
    for t in scenario.tables:
        (feature,) = t.feature_names
        ids = torch.cat([b[feature].values for b in scenario.batches])
        lengths = torch.cat([b[feature].lengths for b in scenario.batches])
        offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)[:-1]])
        w = scenario.weights[t.name].to(torch.float64).requires_grad_(True)
        pooled = F.embedding_bag(ids, w, offsets, mode=t.pooling)
        g = g_all[:, column : column + t.embedding_dim]
        (pooled * g).sum().backward()
        assert w.grad is not None
        parts.append(pooled.detach())
        magnitudes.append(F.embedding_bag(ids, w.detach().abs(), offsets, mode=t.pooling))
        updated[t.name] = w.detach() - LEARNING_RATE * w.grad
        w_abs = w.detach().abs().requires_grad_(True)
        (F.embedding_bag(ids, w_abs, offsets, mode=t.pooling) * g.abs()).sum().backward()
        assert w_abs.grad is not None
        grad_magnitude[t.name] = w_abs.grad
        max_bag = max(max_bag, int(lengths.max()) if lengths.numel() else 0)
        max_count = max(max_count, int(torch.bincount(ids).max()) if ids.numel() else 0)
        column += t.embedding_dim
    return Oracle(
        pooled=torch.cat(parts, dim=1),
        pooled_magnitude=torch.cat(magnitudes, dim=1),
        max_bag=max_bag,
        tables=updated,
        grad_magnitude=grad_magnitude,
        max_count=max_count,
    )
