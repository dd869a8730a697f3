"""Per-rank step-time and memory estimate of a
:class:`Plan` (docs/architecture.md#planner-and-cost-model).

A rank's step time is its lookup and codec time, plus its exchange time on each link
class (alpha-beta: bytes over bandwidth plus per-message latency, per cluster), plus
the data-parallel gradient all-reduce. The plan's step time is the slowest rank's:
collectives wait for it. Memory per rank is weights, optimizer state and exchange
buffers. Constants come from a :class:`Calibration`; per-feature statistics decide
how many unique rows UB moves.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from lightning_embark.errors import ConfigError
from lightning_embark.plan import ClusterPlan, ClusterType, Plan, host_plan
from lightning_embark.planner._hardware import Calibration
from lightning_embark.planner._links import link_seconds
from lightning_embark.planner._stats import DataStats, FeatureStats, from_spec
from lightning_embark.planner._terms import (
    CODEC,
    FLAT_INTER_RECEIVED,
    FLAT_INTER_SENT,
    FLAT_INTRA_RECEIVED,
    FLAT_INTRA_SENT,
    HIER_INTER_RECEIVED,
    HIER_INTER_SENT,
    HIER_INTRA_RECEIVED,
    HIER_INTRA_SENT,
    LOOKUP,
    MEM,
    NUM_TERMS,
    TableLoad,
    TermModel,
)
from lightning_embark.planner._tower_cost import host_module_flops, host_parameters, rail_terms
from lightning_embark.spec import ModelSpec


@dataclass(frozen=True, kw_only=True)
class RankEstimate:
    """One rank's share of a step; times in milliseconds, sizes in bytes."""

    rank: int
    host: int
    compute_ms: float
    intra_ms: float
    inter_ms: float
    latency_ms: float
    allreduce_ms: float
    total_ms: float
    intra_bytes: float
    inter_bytes: float
    memory_bytes: float

    def to_dict(self) -> dict:
        return {k: (v if isinstance(v, int) else float(v)) for k, v in self.__dict__.items()}


@dataclass(frozen=True, kw_only=True)
class Estimate:
    """A plan's estimated step: the slowest rank's time and every rank's breakdown."""

    step_time_ms: float
    per_rank: tuple[RankEstimate, ...]
    stats_source: str = ""

    @property
    def max_memory_bytes(self) -> float:
        return max(r.memory_bytes for r in self.per_rank)

    def to_dict(self) -> dict:
        return {
            "step_time_ms": self.step_time_ms,
            "max_memory_bytes": self.max_memory_bytes,
            "stats_source": self.stats_source,
            "per_rank": [r.to_dict() for r in self.per_rank],
        }


class CostModel:
    """Estimates plans of one model at one batch size on one cluster shape.

    Args:
        spec: The model's tables.
        calib: Hardware constants.
        num_hosts: Hosts in the cluster.
        ranks_per_host: Ranks per host.
        batch_size: Per-rank batch size.
        stats: Measured statistics; None falls back to the analytic estimate from the
            spec (recorded in :attr:`stats_source`).
    """

    def __init__(
        self,
        spec: ModelSpec,
        calib: Calibration,
        *,
        num_hosts: int,
        ranks_per_host: int,
        batch_size: int,
        stats: DataStats | None = None,
    ) -> None:
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigError(
                f"batch_size must be a positive integer (per rank), got {batch_size!r}"
            )
        if (
            not isinstance(num_hosts, int)
            or num_hosts < 1
            or not isinstance(ranks_per_host, int)
            or ranks_per_host < 1
        ):
            raise ConfigError(
                f"hosts ({num_hosts!r}) and ranks per host ({ranks_per_host!r}) must be positive "
                "integers"
            )
        self.spec, self.calib, self.batch_size = spec, calib, batch_size
        self.num_hosts, self.ranks_per_host = num_hosts, ranks_per_host
        self.world = num_hosts * ranks_per_host
        stats = stats or from_spec(spec, batch_size=batch_size)
        self.stats = stats
        self.stats_source = stats.source
        self.features: list[FeatureStats] = stats.for_spec(spec, batch_size)
        self.loads = [
            TableLoad(
                batch=batch_size,
                hotness=f.hotness,
                unique=f.unique_ids(batch_size),
                dim=t.embedding_dim,
                rows=t.num_embeddings,
                alpha=spec.id_distribution.alpha if spec.id_distribution.kind == "zipf" else None,
            )
            for t, f in zip(spec.tables, self.features, strict=False)
        ]
        self.index = {t.name: i for i, t in enumerate(spec.tables)}
        self.terms = TermModel(calib, num_hosts=num_hosts, ranks_per_host=ranks_per_host)

    def table_terms(
        self,
        index: int,
        cluster: ClusterPlan,
        k: int,
        c: int,
        groups,
        *,
        cache_load_factor: float | None = None,
    ) -> np.ndarray:
        """``[NUM_TERMS, world]`` terms of table ``index`` in ``cluster`` (its blocks cached
        in UVM when ``cache_load_factor`` is below 1; DP tables never are)."""
        load = self.loads[index]
        if cluster.type is ClusterType.DP:
            return self.terms.dp(load)
        return self.terms.sharded(load, cluster, k, c, groups, cache_load_factor=cache_load_factor)

    def cluster_overhead(
        self, cluster: ClusterPlan, indices: list[int], replicated: bool
    ) -> float:
        """Seconds every rank spends on the cluster beyond its tables' terms."""
        if not indices:
            return 0.0
        if cluster.type is ClusterType.DP:
            size = sum(4.0 * self.loads[i].rows * self.loads[i].dim for i in indices)
            dense = size / self.calib.dp_dense_bandwidth if self.calib.dp_dense_bandwidth else 0.0
            return self.terms.allreduce(size) + dense
        return self.terms.latency(cluster, replicated)

    def estimate(self, plan: Plan) -> Estimate:
        """The plan's per-rank breakdown and step time (towers included).

        Raises:
            ConfigError: the plan's shape differs from the model's cluster, or it misses a table.
        """
        if plan.world_size != self.world or plan.ranks_per_host != self.ranks_per_host:
            raise ConfigError(
                f"plan is for {plan.world_size} ranks ({plan.ranks_per_host} per host) but the "
                f"cost model is for {self.world} ({self.ranks_per_host} per host); build the "
                "CostModel for the plan's cluster"
            )
        total, latency, overhead = self.accumulate(plan)
        if plan.towers:
            self._add_towers(plan, total, latency, overhead)
        return self.summarise(total, latency, overhead)

    def accumulate(self, plan: Plan) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Summed terms ``[NUM_TERMS, world]``, per-rank latency and all-reduce seconds of
        the plan's flat tables (its towers' tables are priced by :meth:`_add_towers`)."""
        total = np.zeros((NUM_TERMS, self.world))
        members: dict[str, list[int]] = {c.name: [] for c in plan.clusters}
        replicated: dict[str, bool] = {c.name: False for c in plan.clusters}
        layouts = {t.table: t for t in plan.tables}
        clusters = {c.name: c for c in plan.clusters}
        for table in self.spec.tables:
            if plan.towers and plan.tower_of(table.name) is not None:
                continue
            layout = layouts.get(table.name) or plan.layout(table.name)
            cluster = clusters.get(layout.cluster) or plan.cluster(layout.cluster)
            i = self.index[table.name]
            total += self.table_terms(
                i,
                cluster,
                layout.num_row_shards,
                layout.num_col_shards,
                layout.ranks,
                cache_load_factor=layout.cache_load_factor,
            )
            members[cluster.name].append(i)
            if cluster.type is not ClusterType.DP and layout.num_replicas > 1:
                replicated[cluster.name] = True
        overhead = np.zeros(self.world)
        latency = np.zeros(self.world)
        for cluster in plan.clusters:
            extra = self.cluster_overhead(cluster, members[cluster.name], replicated[cluster.name])
            (overhead if cluster.type is ClusterType.DP else latency)[:] += extra
        return total, latency, overhead

    def _add_towers(
        self, plan: Plan, total: np.ndarray, latency: np.ndarray, overhead: np.ndarray
    ) -> None:
        """Add the towers' terms in place (:mod:`._tower_cost`): each host's tower tables
        as the plan its ranks run over ``H * B`` samples, the rail exchanges, the
        tower modules' compute and their all-reduce inside the host."""
        local, hosts = self.ranks_per_host, self.num_hosts
        dims = {t.name: t.embedding_dim for t in self.spec.tables}
        params = host_parameters(plan, dims)
        flops = host_module_flops(plan, dims, samples=hosts * self.batch_size)
        for host in range(hosts):
            sub = host_plan(plan, host)
            if not sub.tables:
                continue
            names = {t.table for t in sub.tables}
            inner = CostModel(
                dataclasses.replace(
                    self.spec, tables=tuple(t for t in self.spec.tables if t.name in names)
                ),
                self.calib,
                num_hosts=1,
                ranks_per_host=local,
                batch_size=hosts * self.batch_size,
                stats=self.stats,
            )
            terms, lat, over = inner.accumulate(sub)
            ranks = slice(host * local, (host + 1) * local)
            total[:, ranks] += terms
            if self.calib.dense_flops:
                total[LOOKUP, ranks] += flops[host] / self.calib.dense_flops
            latency[ranks] += lat
            overhead[ranks] += over + inner.terms.allreduce(4.0 * params[host])
        hotness = {t.name: self.loads[self.index[t.name]].hotness for t in self.spec.tables}
        rail = rail_terms(plan, batch_size=self.batch_size, hotness=hotness, dims=dims)
        total[FLAT_INTER_SENT] += rail.sent
        total[FLAT_INTER_RECEIVED] += rail.received
        if rail.calls:
            latency += (
                rail.calls * (hosts - 1) * self.calib.inter_latency + self.calib.kernel_overhead
            )

    def summarise(self, total: np.ndarray, latency: np.ndarray, allreduce: np.ndarray) -> Estimate:
        """An :class:`Estimate` from summed terms and per-rank cluster overheads."""
        intra, inter = link_seconds(total, self.calib)
        compute = total[LOOKUP] + total[CODEC]
        step = compute + intra + inter + latency + allreduce
        memory = self.memory(total)
        intra_bytes = total[FLAT_INTRA_SENT] + total[HIER_INTRA_SENT]
        inter_bytes = total[FLAT_INTER_SENT] + total[HIER_INTER_SENT]
        per_rank = tuple(
            RankEstimate(
                rank=r,
                host=r // self.ranks_per_host,
                compute_ms=1e3 * compute[r],
                intra_ms=1e3 * intra[r],
                inter_ms=1e3 * inter[r],
                latency_ms=1e3 * latency[r],
                allreduce_ms=1e3 * allreduce[r],
                total_ms=1e3 * step[r],
                intra_bytes=float(intra_bytes[r]),
                inter_bytes=float(inter_bytes[r]),
                memory_bytes=float(memory[r]),
            )
            for r in range(self.world)
        )
        return Estimate(
            step_time_ms=float(1e3 * step.max()), per_rank=per_rank, stats_source=self.stats_source
        )

    def step_seconds(self, total: np.ndarray, fixed: float) -> np.ndarray:
        """Per-rank seconds of summed terms plus a fixed per-rank overhead (fast path)."""
        intra, inter = link_seconds(total, self.calib)
        return total[LOOKUP] + total[CODEC] + intra + inter + fixed

    def memory(self, total: np.ndarray) -> np.ndarray:
        """Per-rank stored bytes plus exchange buffers (``buffer_factor`` steps received)."""
        received = (
            total[FLAT_INTRA_RECEIVED]
            + total[FLAT_INTER_RECEIVED]
            + total[HIER_INTRA_RECEIVED]
            + total[HIER_INTER_RECEIVED]
        )
        return total[MEM] + self.calib.buffer_factor * received


def estimate_plan(
    plan: Plan,
    spec: ModelSpec,
    calib: Calibration,
    *,
    batch_size: int,
    stats: DataStats | None = None,
) -> Estimate:
    """Convenience: estimate ``plan`` for ``spec`` on ``calib`` hardware."""
    model = CostModel(
        spec,
        calib,
        num_hosts=plan.num_hosts,
        ranks_per_host=plan.ranks_per_host,
        batch_size=batch_size,
        stats=stats,
    )
    return model.estimate(plan)
