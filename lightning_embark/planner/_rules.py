"""A plan from a few fixed rules, without a cost model: quick plans for tests and scripts.

The greedy planner (:mod:`.greedy`) is what strategies and ``embark-plan`` use; this
one writes, in one call, the kind of plan one would write by hand from the rules of
docs/architecture.md#embedding-clusters:

* DP for small tables (``num_embeddings <= dp_max_rows``): no forward traffic, but
  a dense all-reduce of ``~rows * d`` per step where RB moves ``~B * d``; the
  default 1000 rows matches a typical per-rank batch.
* UB for features whose measured unique ratio is low: with ``u`` the fraction of a
  batch's IDs that are distinct and ``h`` the hotness, a UB exchange moves ``u * h``
  rows per sample against RB's one pooled vector, so UB wins when
  ``u * h < ub_max_rows_per_sample`` (1.0 is the volume break-even).
* RB for everything else, with the smallest allowed wire format (fp8, int8, fp16,
  bf16, then fp32) for both directions.
* Layout: UB tables are split by rows (hash) over every rank - each unique ID still
  travels once, so splitting costs no volume and spreads lookups. RB tables go whole
  to the least-loaded rank (by rows x width), because every row shard of an RB table
  returns its own partial sum; only tables above ``row_split_bytes`` (default: a
  ``1 / world`` share of all embedding bytes, which no whole-table placement can
  balance) are split by rows, inside the least-loaded host when there are several
  hosts (table-row-wise: partial sums then stay on the fast links).
* Hierarchical exchanges whenever there is more than one host.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from lightning_embark.errors import ConfigError
from lightning_embark.plan import ClusterPlan, ClusterType, Compression, Plan, TableLayout, layouts
from lightning_embark.spec import ModelSpec
from lightning_embark.topology import Topology

#: Smallest wire format first (bytes per value: 1 + row scale, 1 + scale and bias, 2, 2, 4).
COMPRESSION_PREFERENCE = (
    Compression.FP8,
    Compression.INT8,
    Compression.FP16,
    Compression.BF16,
    Compression.FP32,
)


def best_compression(allow: Iterable[Compression | str] | None) -> Compression:
    """The smallest allowed wire format; fp32 when nothing (or only fp32) is allowed."""
    allowed = {Compression(c) for c in (allow or ())}
    return next((c for c in COMPRESSION_PREFERENCE if c in allowed), Compression.FP32)


def rule_based_plan(
    spec: ModelSpec,
    topology_or_shape: Topology | tuple[int, int],
    *,
    unique_ratios: Mapping[str, float] | None = None,
    allow: Iterable[Compression | str] | None = None,
    dp_max_rows: int = 1_000,
    ub_max_rows_per_sample: float = 1.0,
    row_split_bytes: float | None = None,
) -> Plan:
    """A valid plan for ``spec`` on a cluster, from the rules in the module docstring.

    Args:
        spec: The model's tables (table name == feature name).
        topology_or_shape: A :class:`Topology` or ``(num_hosts, ranks_per_host)``.
        unique_ratios: Measured distinct IDs / IDs per batch, by feature; features
            without a measurement go to RB.
        allow: Compressions the plan may use (default: lossless only).
        dp_max_rows: Tables with at most this many rows are data parallel.
        ub_max_rows_per_sample: UB when ``unique_ratio * pooling_factor`` is below this.
        row_split_bytes: RB tables with more fp32 weight bytes are split by rows
            (default: total embedding bytes / world size).

    Raises:
        ConfigError: a ratio is outside (0, 1], names an unknown feature, or the shape is bad.
    """
    if isinstance(topology_or_shape, Topology):
        hosts, local = topology_or_shape.num_hosts, topology_or_shape.ranks_per_host
    else:
        hosts, local = topology_or_shape
    if hosts < 1 or local < 1:
        raise ConfigError(
            f"cluster shape must be positive (hosts, ranks_per_host), got {(hosts, local)}"
        )
    world = hosts * local
    ratios = dict(unique_ratios or {})
    unknown = sorted(set(ratios) - set(spec.feature_names))
    if unknown:
        raise ConfigError(f"unique_ratios names features not in spec {spec.name!r}: {unknown}")
    for name, ratio in ratios.items():
        if not 0 < ratio <= 1:
            raise ConfigError(f"unique ratio of feature {name!r} must be in (0, 1], got {ratio}")
    compression = best_compression(allow)
    total = sum(4 * t.num_embeddings * t.embedding_dim for t in spec.tables)
    split_above = row_split_bytes if row_split_bytes is not None else total / world
    load = [0] * world
    chosen: dict[ClusterType, list[TableLayout]] = {t: [] for t in ClusterType}
    # Big tables first so the greedy placement balances what is left.
    for table in sorted(spec.tables, key=lambda t: -t.num_embeddings * t.embedding_dim):
        size = table.num_embeddings * table.embedding_dim
        if table.num_embeddings <= dp_max_rows:
            chosen[ClusterType.DP].append(layouts.data_parallel(table.name, "dp", world))
            continue
        measured = ratios.get(table.feature_name)
        ub = measured is not None and measured * table.pooling_factor < ub_max_rows_per_sample
        kind = ClusterType.UB if ub else ClusterType.RB
        if world > 1 and table.num_embeddings >= world and (ub or 4 * size > split_above):
            if ub or hosts == 1:
                layout = layouts.row_wise(table.name, kind.value, range(world))
            else:
                host = min(range(hosts), key=lambda h: sum(load[h * local : (h + 1) * local]))
                layout = layouts.table_row_wise(table.name, kind.value, host, local)
            for block, rank in enumerate(layout.ranks[0]):
                load[rank] += layout.shard_rows(block, table.num_embeddings) * table.embedding_dim
        else:
            rank = min(range(world), key=lambda r: load[r])
            load[rank] += size
            layout = layouts.table_wise(table.name, kind.value, rank)
        chosen[kind].append(layout)
    clusters = []
    for kind in (ClusterType.DP, ClusterType.RB, ClusterType.UB):
        if not chosen[kind]:
            continue
        if kind is ClusterType.DP:
            clusters.append(ClusterPlan(name="dp", type=kind))
        else:
            clusters.append(
                ClusterPlan(
                    name=kind.value,
                    type=kind,
                    forward_compression=compression,
                    backward_compression=compression,
                    hierarchical=hosts > 1,
                )
            )
    order = {t.name: i for i, t in enumerate(spec.tables)}
    tables = sorted(
        (layout for group in chosen.values() for layout in group),
        key=lambda layout: order[layout.table],
    )
    plan = Plan(
        world_size=world, ranks_per_host=local, clusters=tuple(clusters), tables=tuple(tables)
    )
    plan.validate(spec, topology_or_shape if isinstance(topology_or_shape, Topology) else None)
    return plan
