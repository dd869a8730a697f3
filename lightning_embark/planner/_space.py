"""The greedy planner's layout space, what it means for a plan to fit, and balanced plans.

**Layout space.** For a cost model (its spec, calibration and ``H`` hosts of ``L``
ranks, ``W = H L``) and a :class:`~lightning_embark.planner.GreedyConfig`, the
planner's layout space is the set of plans in which

* every table is either data parallel (cluster ``dp``: a replica on each of the ``W``
  ranks; only with ``config.dp`` and ``W > 1``) or held once (``r = 1``) in an
  exchanged cluster of type RB (``rb``, or ``rb_rows`` when ``k > 1``) or UB (``ub``),
  split into ``k`` row and ``c`` column shards with ``(k, c)`` from
  :func:`~lightning_embark.planner._split.candidate_shapes` (``c`` divides the width,
  columns at least ``min_col_width`` wide; ``k`` a power of two up to ``L`` or a
  multiple of ``L`` up to ``W``; ``k <= rows``, ``k c <= W``, within
  ``max_row_shards`` and ``max_col_shards``), its ``k c`` blocks on any ranks;
* every exchanged cluster uses the planning compression (the allowed one with the
  fewest bytes per row) and is flat or hierarchical as ``config.hierarchical``
  allows (either, per cluster, when it is None and there are several hosts).

A plan *fits* when every rank ``q`` has
``M_q = stored_q + buffer_factor * received_q <= memory_per_rank``: the weights and
optimizer state of its blocks and replicas plus the bytes it receives in one step, as
:meth:`~lightning_embark.planner.CostModel.memory` counts them. Fitting implies
:meth:`~lightning_embark.plan.Plan.validate`'s memory check, which counts weights and
per-element optimizer state only.

**Balanced plans.** A plan is balanced when every table is DP or has exactly one block
on every rank (``k c = W``). Such a layout puts the same terms on every rank (each rank
holds one block and requests the ``W - 1`` others; each host holds ``L`` blocks), so
table ``t`` with option ``o`` (cluster type and split) costs every rank the same
``m_t(o, f)`` under the hierarchical flag ``f`` of its cluster, and since terms add
over tables::

    min over balanced plans of max_q M_q  =  min over f of  sum_t  min_o m_t(o, f)

with ``f`` ranging over the flag assignments of the three exchanged clusters (at most
8). A balanced plan fits exactly when that minimum is at most ``memory_per_rank``:
deciding it takes a few evaluations per table.

**Completeness.** If some balanced plan fits, the planner returns a fitting plan (the
greedy's own, else :mod:`._balanced`'s). Whether any plan of the whole space fits is a
bin-packing question (tables too small to split are items, ranks are bins; NP-hard),
so beyond balanced plans nothing is claimed; the planner still tries a packing there,
and when it raises :class:`~lightning_embark.errors.PlanInfeasibleError` the message
says by how much the cheapest balanced plan misses. A table with no balanced option
(fewer rows than ``W``, or shard caps that forbid ``k c = W``) takes no part in the
claim; it is placed after the others.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lightning_embark.errors import PlanInfeasibleError
from lightning_embark.plan import (
    ClusterPlan,
    ClusterType,
    Compression,
    Plan,
    RowSplit,
    TableLayout,
)
from lightning_embark.planner._cost import CostModel
from lightning_embark.planner._placement import Placer, size_text
from lightning_embark.planner._split import Candidates, Shape, candidate_shapes

#: Cluster names of the space, in plan order; the last three are exchanged.
CLUSTERS = ("dp", "rb", "rb_rows", "ub")
EXCHANGED = CLUSTERS[1:]


@dataclass(frozen=True)
class Layout:
    """One table's place in a plan of the space.

    Attributes:
        type: Its cluster type.
        k: Row shards.
        c: Column shards.
        ranks: Rank of block ``i * c + j`` (row shard ``i``, column shard ``j``); empty
            for DP, which is on every rank.
    """

    type: ClusterType
    k: int = 1
    c: int = 1
    ranks: tuple[int, ...] = ()

    @property
    def cluster(self) -> str:
        if self.type is ClusterType.DP:
            return "dp"
        if self.type is ClusterType.UB:
            return "ub"
        return "rb_rows" if self.k > 1 else "rb"

    def table_layout(self, name: str, world: int) -> TableLayout:
        if self.type is ClusterType.DP:
            return TableLayout(
                table=name,
                cluster="dp",
                num_replicas=world,
                ranks=tuple((r,) for r in range(world)),
            )
        return TableLayout(
            table=name,
            cluster=self.cluster,
            num_row_shards=self.k,
            num_col_shards=self.c,
            row_split=RowSplit.RANGE if self.k > 1 else RowSplit.HASH,
            ranks=(self.ranks,),
        )


def flag_choices(num_hosts: int, hierarchical: bool | None) -> tuple[bool, ...]:
    """The hierarchical flags a cluster of the space may take."""
    if num_hosts == 1 or hierarchical is False:
        return (False,)
    return (True,) if hierarchical else (False, True)


@dataclass(frozen=True, kw_only=True)
class SpaceConfig:
    """The greedy's knobs that bound the space.

    Attributes:
        compression: The planning compression of every exchanged cluster.
        dp: Whether tables may be data parallel.
        hierarchical: The greedy's setting (None: either, per cluster).
        min_col_width: Narrowest column shard.
        max_row_shards: Cap on ``k``; None: up to the world.
        max_col_shards: Cap on ``c``; None: as the width allows.
    """

    compression: Compression
    dp: bool
    hierarchical: bool | None
    min_col_width: int
    max_row_shards: int | None = None
    max_col_shards: int | None = None


class Space:
    """The layout space of one cost model: layouts' terms, balanced options, placement.

    Args:
        model: The cost model whose memory decides what fits.
        shape: The greedy's cluster shape (scalar split costs).
        config: The space's bounds.
        limit: Bytes per rank (``memory_per_rank``).
    """

    def __init__(self, model: CostModel, shape: Shape, config: SpaceConfig, *, limit: float):
        assert np.isfinite(limit), "without a memory limit every plan fits"
        self.model, self.shape, self.config, self.limit = model, shape, config, limit
        #: Each exchanged cluster's hierarchical flag (set by the balanced certificate).
        self.flags: dict[str, bool] = {}

    def cluster(self, name: str, hierarchical: bool | None = None) -> ClusterPlan:
        """Settings of cluster ``name``: its flag in :attr:`flags` unless ``hierarchical``."""
        if name == "dp":
            return ClusterPlan(name="dp", type=ClusterType.DP)
        comp = self.config.compression
        return ClusterPlan(
            name=name,
            type=ClusterType(name.split("_")[0]),
            forward_compression=comp,
            backward_compression=comp,
            hierarchical=self.flags.get(name, False) if hierarchical is None else hierarchical,
        )

    def terms(self, index: int, layout: Layout, hierarchical: bool | None = None) -> np.ndarray:
        """``[NUM_TERMS, world]`` terms of table ``index`` laid out as ``layout``."""
        cluster = self.cluster(layout.cluster, hierarchical)
        return self.model.table_terms(index, cluster, layout.k, layout.c, (layout.ranks,))

    def stored(self, index: int) -> float:
        """Elements of table ``index`` (the order tables are laid out in: largest first)."""
        load = self.model.loads[index]
        return float(load.rows) * load.dim

    def balanced_layouts(self, index: int) -> list[Layout]:
        """Table ``index``'s options with one block per rank, and DP where allowed."""
        model, config = self.model, self.config
        world = model.world
        out = [Layout(type=ClusterType.DP)] if config.dp and world > 1 else []
        pairs = candidate_shapes(
            model.loads[index],
            self.shape,
            min_col_width=config.min_col_width,
            max_blocks=world,
            max_row_shards=config.max_row_shards,
            max_col_shards=config.max_col_shards,
        )
        for kind in (ClusterType.RB, ClusterType.UB):
            for k, c in pairs:
                if k * c == world:  # block (i, j) on rank j * k + i: a column's rows together
                    ranks = tuple(j * k + i for i in range(k) for j in range(c))
                    out.append(Layout(type=kind, k=k, c=c, ranks=ranks))
        return out

    def candidates(self, index: int, kind: ClusterType) -> Candidates:
        """The greedy's candidate splits of table ``index`` as ``kind``, with scalar costs."""
        config = self.config
        return Candidates(
            self.model.loads[index],
            kind,
            self.shape,
            min_col_width=config.min_col_width,
            hierarchical=self.model.num_hosts > 1 and config.hierarchical is not False,
            max_row_shards=config.max_row_shards,
            max_col_shards=config.max_col_shards,
        )

    def place(
        self,
        index: int,
        kind: ClusterType,
        k: int,
        c: int,
        rest: np.ndarray,
        *,
        seconds: float,
        roomiest: bool,
        strict: bool = False,
    ) -> tuple[Layout, np.ndarray] | None:
        """Table ``index`` as ``(kind, k, c)`` beside the terms ``rest``, its blocks on the
        least-loaded ranks with room (with ``roomiest``, the emptiest), and its terms; None
        when the placement does not fit (with ``strict``, raises instead).

        A probe with the blocks on ranks ``0 .. k c - 1`` estimates what a block needs
        (its rank's memory over a rank without one) and what the table costs every rank
        (the latter); the placement found is then checked exactly.

        Args:
            seconds: The block's scalar cost, which the least-loaded choice adds per block.

        Raises:
            PlanInfeasibleError: with ``strict``, no placement fits; names the table and
                the shortfall.
        """
        model = self.model
        memory = model.memory(
            self.terms(index, Layout(type=kind, k=k, c=c, ranks=tuple(range(k * c))))
        )
        base = float(memory[-1]) if k * c < model.world else 0.0
        need = float(memory[0]) - base
        free = self.limit - model.memory(rest) - base
        placer = Placer(num_hosts=model.num_hosts, ranks_per_host=model.ranks_per_host, capacity=0)
        placer.free = free.copy()
        placer.load = -free if roomiest else model.step_seconds(rest, 0.0).copy()
        name = model.spec.tables[index].name
        try:
            ranks = placer.place(
                name,
                k=k,
                c=c,
                load=need if roomiest else seconds,
                size=need,
                by_host=kind is ClusterType.RB and k > 1 and self.flags.get("rb_rows", False),
            )
        except PlanInfeasibleError:
            if strict:
                raise
            return None
        layout = Layout(type=kind, k=k, c=c, ranks=tuple(ranks))
        terms = self.terms(index, layout)
        over = float(model.memory(rest + terms).max()) - self.limit
        if over <= 0:
            return layout, terms
        if strict:
            raise PlanInfeasibleError(
                f"table {name!r} does not fit: placed as {k} x {c} blocks, a rank needs "
                f"{size_text(self.limit + over)} with exchange buffers but has "
                f"{size_text(self.limit)} (short by {size_text(over)}); add ranks or memory "
                "per rank, or cap rows with --max-rows",
                table=name,
                shortfall_bytes=over,
            )
        return None

    def plan(self, layouts: list[Layout]) -> Plan:
        """The plan of one layout per table, in the clusters they use."""
        model = self.model
        used = {layout.cluster for layout in layouts}
        return Plan(
            world_size=model.world,
            ranks_per_host=model.ranks_per_host,
            clusters=tuple(self.cluster(name) for name in CLUSTERS if name in used),
            tables=tuple(
                layout.table_layout(t.name, model.world)
                for t, layout in zip(model.spec.tables, layouts, strict=True)
            ),
        )
