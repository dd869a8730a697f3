"""The greedy planner, after EMBark: cluster types, DP, 3D splits, placement.

Per table: the cluster type from statistics (UB where unique rows cost less than
``B`` pooled rows), data parallelism for tables whose all-reduce is cheaper than
serving lookups, then the cheapest ``(k, c)`` split whose blocks stay under a load
target and the memory cap. Blocks go, largest first, to the least-loaded rank (row
shards of a column shard to the least-loaded host, so a hierarchical RB exchange
reduces them inside the host). Each exchanged cluster then takes the hierarchical
setting and compression (from the allowed set) that lower the slowest rank's time.
Several load targets are tried and the plan with the lowest estimated step time
kept, like EMBark's split-until-no-better loop but without re-evaluating the whole
plan per split. Everything iterates in a fixed order, so plans are deterministic.

This module holds the search over load targets, the exchange tuning and the fallbacks
(balanced plan, UVM caches); the knobs and the result are
:mod:`~lightning_embark.planner._greedy_config`'s, the layout for one target (DP tables,
splits, placement) :mod:`~lightning_embark.planner._greedy_layout`'s.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from lightning_embark.errors import PlanInfeasibleError
from lightning_embark.plan import Plan
from lightning_embark.planner._balanced import BalancedPlanner
from lightning_embark.planner._cost import CostModel
from lightning_embark.planner._greedy_config import GreedyConfig, Planner, PlanResult
from lightning_embark.planner._greedy_layout import choose_dp, plan_once
from lightning_embark.planner._placement import size_text
from lightning_embark.planner._space import Space, SpaceConfig
from lightning_embark.planner._split import Candidates, Shape, cluster_type, split_cost
from lightning_embark.planner._terms import MEM, row_bytes
from lightning_embark.planner._tuning import hierarchical_flags, merge_clusters, tune_clusters
from lightning_embark.planner._uvm import assign_caches, cached_tables, uvm_enabled

GIB = 2**30


class GreedyPlanner(Planner):
    """EMBark-style greedy planner (see the module docstring)."""

    def __init__(self, config: GreedyConfig | None = None) -> None:
        self.config = config or GreedyConfig()

    def plan(self, model: CostModel) -> PlanResult:
        """Plan ``model.spec`` for ``model``'s cluster and batch; on GPU hardware, with UVM
        caches for what does not fit HBM (:meth:`_plan_with_caches`).

        Raises:
            PlanInfeasibleError: the tables cannot fit (HBM, nor host memory behind HBM
                caches where the hardware has them); names the table and the shortfall.
        """
        calib = model.calib
        if not (self.config.uvm_caching and uvm_enabled(calib)):
            return self._plan_in_hbm(model)
        assert calib.memory_per_rank is not None
        # Every table stored once needs this much whatever the layout: past the world's
        # HBM no plan fits it, and the greedy's search for one would only take time.
        least = sum(model.terms.element_bytes(load.rows, load.dim) for load in model.loads)
        if least > model.world * calib.memory_per_rank:
            return self._plan_with_caches(
                model,
                PlanInfeasibleError(
                    f"the tables need {size_text(least)} stored once, more than the "
                    f"{model.world} ranks' {size_text(model.world * calib.memory_per_rank)} "
                    "of HBM",
                    table=max(model.spec.tables, key=lambda t: t.num_embeddings).name,
                    shortfall_bytes=least - model.world * calib.memory_per_rank,
                ),
            )
        try:
            return self._plan_in_hbm(model)
        except PlanInfeasibleError as error:
            return self._plan_with_caches(model, error)

    def _plan_with_caches(self, model: CostModel, error: PlanInfeasibleError) -> PlanResult:
        """Lay out as if HBM were the host memory, then cache what overflows HBM.

        The layout comes from the greedy under the host memory per rank
        (``host_memory_per_rank``; DP tables, which stay in HBM, within the same share of
        HBM as without caches); every rank then over its HBM gets one cache factor for
        its sharded blocks (:func:`~._uvm.assign_caches`) and the estimate prices the
        misses under the real hardware.

        Raises:
            PlanInfeasibleError: not even the host memory holds the tables, or a rank's
                uncacheable part overflows its HBM.
        """
        start = time.perf_counter()
        calib = model.calib
        assert calib.memory_per_rank is not None and calib.host_memory_per_rank is not None
        # DP replicas stay in HBM: keep their budget a share of HBM, not of host memory.
        config = dataclasses.replace(
            self.config,
            dp_fraction=self.config.dp_fraction
            * calib.memory_per_rank
            / calib.host_memory_per_rank,
        )
        host = CostModel(
            model.spec,
            dataclasses.replace(calib, memory_per_rank=calib.host_memory_per_rank),
            num_hosts=model.num_hosts,
            ranks_per_host=model.ranks_per_host,
            batch_size=model.batch_size,
            stats=model.stats,
        )
        laid_out = GreedyPlanner(config)._plan_in_hbm(host)
        total, _, _ = model.accumulate(laid_out.plan)
        stored = total[MEM]
        plan = assign_caches(
            laid_out.plan,
            stored=stored,
            buffers=model.memory(total) - stored,
            rows_of={t.name: t.num_embeddings for t in model.spec.tables},
            dims={t.name: t.embedding_dim for t in model.spec.tables},
            calib=calib,
            memory_fraction=self.config.memory_fraction,
        )
        plan.validate(
            model.spec,
            calib.topology(num_hosts=model.num_hosts, ranks_per_host=model.ranks_per_host),
            bytes_per_row_element=calib.bytes_per_element,
        )
        cached = cached_tables(plan)
        factors = [
            t.cache_load_factor
            for t in plan.tables
            if t.cache_load_factor is not None and t.table in set(cached)
        ]
        note = (
            f"UVM caching: no plan fits HBM ({error}); {len(cached)} of {len(plan.tables)} "
            f"tables live in host memory behind HBM caches of "
            f"{min(factors, default=1.0):.3g}-{max(factors, default=1.0):.3g} of their rows, "
            "their misses priced over the host link"
        )
        return PlanResult(
            plan=plan,
            estimate=model.estimate(plan),
            planning_seconds=time.perf_counter() - start,
            notes=(*laid_out.notes, note),
        )

    def _plan_in_hbm(self, model: CostModel) -> PlanResult:
        """The greedy (and its balanced fallback) within ``model``'s memory per rank.

        Raises:
            PlanInfeasibleError: the tables cannot fit; names the table and the shortfall.
        """
        start = time.perf_counter()
        # Each exchanged cluster's hierarchical flag, decided on the first layout tuned;
        # later load targets reuse it (local, so that plan() is re-entrant).
        fixed: dict[str, bool] = {}
        cfg, calib = self.config, model.calib
        world = model.world
        cheapest = min(cfg.allow, key=lambda c: row_bytes(c, 128, backward=False))
        shape = Shape(
            calib,
            num_hosts=model.num_hosts,
            ranks_per_host=model.ranks_per_host,
            compression=cheapest,
        )
        capacity = (
            np.inf
            if calib.memory_per_rank is None
            else calib.memory_per_rank * cfg.memory_fraction
        )
        hier = model.num_hosts > 1 and cfg.hierarchical is not False
        kinds = [cluster_type(load, cheapest, cfg.ub_threshold) for load in model.loads]
        dp = choose_dp(model, shape, kinds, capacity, cfg)
        base = [
            split_cost(load, kinds[i], 1, 1, shape, hier) for i, load in enumerate(model.loads)
        ]
        candidates = {
            i: Candidates(
                load,
                kinds[i],
                shape,
                min_col_width=cfg.min_col_width,
                hierarchical=hier,
                max_row_shards=cfg.max_row_shards,
                max_col_shards=cfg.max_col_shards,
            )
            for i, load in enumerate(model.loads)
            if i not in dp
        }
        mean = sum(base[i].total for i in range(len(base)) if i not in dp) / world
        limit = np.inf if calib.memory_per_rank is None else float(calib.memory_per_rank)
        best: tuple[float, Plan] | None = None
        error: PlanInfeasibleError | None = None
        for _ in range(3):  # shrink the block budget while exchange buffers overflow a rank
            overflow = 0.0
            for factor in cfg.targets:
                try:
                    plan = plan_once(
                        model,
                        shape,
                        kinds,
                        dp,
                        candidates,
                        target=factor * mean,
                        capacity=capacity,
                        hier=hier,
                    )
                except PlanInfeasibleError as err:
                    error = error or err
                    continue
                plan, step, memory = tune_clusters(
                    model, plan, (cheapest,), fixed, hierarchical=cfg.hierarchical
                )
                fixed.update(hierarchical_flags(plan))
                if memory.max() > limit:
                    rank = int(memory.argmax())
                    overflow = max(overflow, float(memory.max() - limit))
                    table = max(
                        (t for t in plan.tables if any(rank in g for g in t.ranks)),
                        key=lambda t: model.loads[model.index[t.table]].rows,
                        default=plan.tables[0],
                    ).table
                    error = PlanInfeasibleError(
                        f"table {table!r} does not fit: with exchange buffers its rank {rank} "
                        f"needs {size_text(float(memory.max()))} but has {size_text(limit)} "
                        f"(short by {size_text(float(memory.max()) - limit)}); lower "
                        "--batch-size, add ranks or memory, or cap rows with --max-rows",
                        table=table,
                        shortfall_bytes=float(memory.max()) - limit,
                    )
                    continue
                if best is None or step < best[0] - 1e-12:
                    best = (step, plan)
            if best is not None or overflow == 0.0:
                break
            capacity -= 1.05 * overflow
            if capacity <= 0:
                break
        notes = []
        if best is None:  # the greedy found no fitting plan: the balanced fallback's
            assert error is not None
            space = SpaceConfig(
                compression=cheapest,
                dp=cfg.dp,
                hierarchical=cfg.hierarchical,
                min_col_width=cfg.min_col_width,
                max_row_shards=cfg.max_row_shards,
                max_col_shards=cfg.max_col_shards,
            )
            laid_out = BalancedPlanner(
                Space(model, shape, space, limit=limit), kinds=kinds, dp=dp
            ).plan()
            fixed = hierarchical_flags(laid_out)
            notes.append(
                f"memory-bound: the greedy found no fitting plan ({error}); this one starts "
                "from the cheapest balanced plan (one block per rank)"
            )
        else:
            laid_out = best[1]
        plan = merge_clusters(
            model, laid_out, (cheapest,), limit=limit, fixed=fixed, hierarchical=cfg.hierarchical
        )
        if len(cfg.allow) > 1:  # compressions are chosen once, on the best layout
            tuned, _, memory = tune_clusters(
                model, plan, cfg.allow, {}, hierarchical=cfg.hierarchical
            )
            if memory.max() <= limit:
                plan = tuned
        plan.validate(
            model.spec,
            calib.topology(num_hosts=model.num_hosts, ranks_per_host=model.ranks_per_host),
            bytes_per_row_element=calib.bytes_per_element,
        )
        estimate = model.estimate(plan)
        if "not measured" in model.stats_source:
            notes.append(f"statistics: {model.stats_source}")
        return PlanResult(
            plan=plan,
            estimate=estimate,
            planning_seconds=time.perf_counter() - start,
            notes=tuple(notes),
        )
