"""The greedy planner's memory fallback: a fitting plan whenever a balanced one exists.

When the greedy finds no plan that fits (its splits and least-loaded placement leave
some table without room), this module plans over the layout space of :mod:`._space`,
memory first:

1. **Certificate.** The cheapest balanced plan (every table DP or one block per rank)
   and each exchanged cluster's flag, exactly, as :mod:`._space` derives. If it fits,
   it is the start; tables with no balanced option then go, largest first, in their
   split with the smallest blocks onto the roomiest ranks.
2. **Packing**, when no balanced plan fits: a table split over every rank has its
   exchange buffers on every rank, so many small tables may fit whole where they do
   not spread. Largest first, each table takes one of its balanced option and its
   smallest-block split per block count (blocks on the roomiest ranks): the one that
   adds the least memory over all ranks, among those that keep every rank fitting and
   (rule ``level``) leave the fullest rank no fuller than spreading the table would;
   failing that, the same without that condition (rule ``least``). The first packing
   that places every table is the start; otherwise the certificate's shortfall is
   raised.
3. **Improvement.** One block per rank costs each requester a piece per block and
   every table a visit to every rank. Each table in turn (largest first) takes the
   first alternative that lowers the estimated step with every rank still fitting:
   DP where the greedy chose it, the greedy's cluster type on the same blocks, then
   the greedy's splits, cheapest total cost first, on the least-loaded ranks with room
   (or, failing that, the roomiest). Two rounds at most.

Every step keeps every rank within ``memory_per_rank``, so the result fits, and the
planner is complete for balanced plans (:mod:`._space`). Everything iterates in a
fixed order, so plans are deterministic.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import numpy as np

from lightning_embark.errors import PlanInfeasibleError
from lightning_embark.plan import ClusterType, Plan
from lightning_embark.planner._placement import size_text
from lightning_embark.planner._space import CLUSTERS, EXCHANGED, Layout, Space, flag_choices
from lightning_embark.planner._terms import NUM_TERMS

#: Splits of the greedy each table tries in the improvement pass (cheapest first).
TRIES = 6
#: Packing rules tried in turn when no balanced plan fits (see the module docstring).
PACKINGS = ("level", "least")
#: Improvement rounds over all tables.
ROUNDS = 2


class BalancedPlanner:
    """Builds the fallback plan of the module docstring.

    Args:
        space: The layout space (its model, bounds and memory limit).
        kinds: The greedy's cluster type per table (RB or UB).
        dp: Tables the greedy made data parallel, which the improvement may too.
    """

    def __init__(self, space: Space, *, kinds: list[ClusterType], dp: set[int]) -> None:
        self.space, self.kinds, self.dp = space, kinds, dp
        self.model = space.model
        self.order = sorted(range(len(kinds)), key=lambda i: (-space.stored(i), i))

    def plan(self) -> Plan:
        """The fallback plan.

        Raises:
            PlanInfeasibleError: no balanced plan fits and the packing finds none either,
                or a table without a balanced option finds no room; names the table and
                the shortfall.
        """
        space, world = self.space, self.model.world
        balanced, needed, shares = self.certificate()
        if needed <= space.limit:
            layouts = [layout or Layout(type=self.kinds[i]) for i, layout in enumerate(balanced)]
            terms = [
                np.zeros((NUM_TERMS, world)) if layout is None else space.terms(i, layout)
                for i, layout in enumerate(balanced)
            ]
            total = np.sum(terms, axis=0)
            for i in self.order:
                if balanced[i] is None:
                    layouts[i], terms[i] = self._unbalanced(i, total)
                    total = total + terms[i]
        else:
            for rule in PACKINGS:
                packed = self._pack(balanced, rule)
                if packed is not None:
                    break
            else:
                raise self._shortfall(needed, shares)
            layouts, terms = packed
        layouts, terms = self._improve(layouts, terms)
        assert self.model.memory(np.sum(terms, axis=0)).max() <= space.limit * (1 + 1e-12)
        return space.plan(layouts)

    def certificate(self) -> tuple[list[Layout | None], float, list[float]]:
        """The cheapest balanced plan: per table its option (None: it has none), what it
        needs per rank and each table's share; sets the space's cluster flags."""
        space, model = self.space, self.model
        options = [space.balanced_layouts(i) for i in range(len(model.loads))]
        flags = flag_choices(model.num_hosts, space.config.hierarchical)
        cost: dict[tuple[int, int, bool], float] = {}
        for i, layouts in enumerate(options):
            for j, layout in enumerate(layouts):
                for flag in flags if layout.type is not ClusterType.DP else (False,):
                    memory = model.memory(space.terms(i, layout, flag))
                    # the same on every rank, as the space's docstring argues
                    assert np.ptp(memory) <= 1e-9 * float(memory.max()) + 1e-3
                    cost[i, j, flag] = float(memory.max())
        best: tuple[float, dict[str, bool], list[Layout | None], list[float]] | None = None
        for assignment in itertools.product(flags, repeat=len(EXCHANGED)):
            chosen = dict(zip(EXCHANGED, assignment, strict=True))
            picks: list[Layout | None] = []
            shares: list[float] = []
            for i, layouts in enumerate(options):
                scores = [cost[i, j, chosen.get(o.cluster, False)] for j, o in enumerate(layouts)]
                j = int(np.argmin(scores)) if scores else -1
                picks.append(layouts[j] if scores else None)
                shares.append(scores[j] if scores else 0.0)
            needed = float(sum(shares))
            if best is None or needed < best[0]:
                best = (needed, chosen, picks, shares)
        assert best is not None
        needed, space.flags, picks, shares = best
        return picks, needed, shares

    def _shortfall(self, needed: float, shares: list[float]) -> PlanInfeasibleError:
        """The error when no balanced plan fits: the table with the largest share."""
        worst = int(np.argmax(shares))
        name = self.model.spec.tables[worst].name
        limit = self.space.limit
        return PlanInfeasibleError(
            f"table {name!r} does not fit: no plan found, and with every table split into one "
            f"block per rank over all {self.model.world} ranks (or replicated where that takes "
            f"less) each rank needs {size_text(needed)} with exchange buffers but has "
            f"{size_text(limit)} (short by {size_text(needed - limit)}; {name!r} takes "
            f"{size_text(shares[worst])} of it); add ranks or memory per rank, or cap rows "
            "with --max-rows",
            table=name,
            shortfall_bytes=needed - limit,
        )

    def _unbalanced(self, index: int, total: np.ndarray) -> tuple[Layout, np.ndarray]:
        """A table without a balanced option, in its split with the smallest blocks, on
        the roomiest ranks beside the terms ``total``.

        Raises:
            PlanInfeasibleError: its blocks find no room; names the table and the shortfall.
        """
        cands = self.space.candidates(index, self.kinds[index])
        i = int(np.lexsort((cands.k * cands.c, cands.bytes))[0])
        k, c = int(cands.k[i]), int(cands.c[i])
        try:
            placed = self.space.place(
                index,
                self.kinds[index],
                k,
                c,
                total,
                seconds=float(cands.block[i]),
                roomiest=True,
                strict=True,
            )
        except PlanInfeasibleError as error:
            raise PlanInfeasibleError(
                f"{error} (it has no split into one block per rank: k * c = "
                f"{self.model.world} is not among its candidate splits, for too few rows or "
                "the row and column shard caps)",
                table=error.table,
                shortfall_bytes=error.shortfall_bytes,
            ) from error
        assert placed is not None  # strict: placed or raised
        return placed

    def _pack(
        self, balanced: list[Layout | None], rule: str
    ) -> tuple[list[Layout], list[np.ndarray]] | None:
        """One packing pass (``rule`` ``"level"`` or ``"least"``, see the module docstring)
        over each table's balanced option and its smallest-block split per block count;
        None when some table finds no room."""
        space, model = self.space, self.model
        layouts: list[Layout | None] = [None] * len(balanced)
        terms: list[np.ndarray] = [np.zeros((NUM_TERMS, model.world))] * len(balanced)
        total = np.zeros((NUM_TERMS, model.world))
        for i in self.order:
            options: list[tuple[Layout, np.ndarray]] = []
            layout = balanced[i]
            if layout is not None:
                options.append((layout, space.terms(i, layout)))
            kind = self.kinds[i]
            cands = space.candidates(i, kind)
            blocks = cands.k * cands.c
            for n in np.unique(blocks):
                j = int(np.flatnonzero(blocks == n)[np.argmin(cands.bytes[blocks == n])])
                k, c = int(cands.k[j]), int(cands.c[j])
                seconds = float(cands.block[j])
                placed = space.place(i, kind, k, c, total, seconds=seconds, roomiest=True)
                if placed is not None:
                    options.append(placed)
            now = model.memory(total)
            added = [model.memory(t) for _, t in options]  # memory is linear in the terms
            fullest = [float((now + a).max()) for a in added]
            # "level": no worse for the fullest rank than spreading the table would be
            ceiling = float(now.max()) + float(added[0].max()) if layout is not None else np.inf
            scored = [
                (float(a.sum()), f, j)
                for j, (a, f) in enumerate(zip(added, fullest, strict=True))
                if f <= space.limit and (rule == "least" or f <= ceiling * (1 + 1e-12))
            ]
            if not scored:
                return None
            pick = min(scored)[2]
            layouts[i], terms[i] = options[pick]
            total = total + terms[i]
        done = [layout for layout in layouts if layout is not None]
        assert len(done) == len(layouts)  # every table was laid out
        return done, terms

    def _step(self, total: np.ndarray, layouts: list[Layout]) -> float:
        """Estimated step (seconds, the slowest rank) of the plan of ``layouts``."""
        members: dict[str, list[int]] = {name: [] for name in CLUSTERS}
        for i, layout in enumerate(layouts):
            members[layout.cluster].append(i)
        fixed = sum(
            self.model.cluster_overhead(self.space.cluster(name), members[name], False)
            for name in CLUSTERS
        )
        return float(self.model.step_seconds(total, fixed).max())

    def _improve(
        self, layouts: list[Layout], terms: list[np.ndarray]
    ) -> tuple[list[Layout], list[np.ndarray]]:
        """The improvement pass of the module docstring."""
        limit = self.space.limit
        layouts, terms = list(layouts), list(terms)
        for _ in range(ROUNDS):
            total = np.sum(terms, axis=0)
            step = self._step(total, layouts)
            changed = False
            for i in self.order:
                rest = total - terms[i]
                for layout, new in self._tries(i, rest, layouts[i]):
                    trial = [*layouts[:i], layout, *layouts[i + 1 :]]
                    candidate = rest + new
                    after = self._step(candidate, trial)
                    if after < step * (1 - 1e-9) and self.model.memory(candidate).max() <= limit:
                        layouts, terms[i], total, step = trial, new, candidate, after
                        changed = True
                        break
            if not changed:
                break
        return layouts, terms

    def _tries(
        self, index: int, rest: np.ndarray, current: Layout
    ) -> Iterator[tuple[Layout, np.ndarray]]:
        """Placed alternatives for table ``index`` beside ``rest``, in the greedy's order of
        preference: DP where the greedy chose it, its cluster type on the same blocks,
        then its cheapest splits."""
        space, kind = self.space, self.kinds[index]
        if index in self.dp and current.type is not ClusterType.DP:
            layout = Layout(type=ClusterType.DP)
            yield layout, space.terms(index, layout)
        if current.type not in (ClusterType.DP, kind):
            layout = Layout(type=kind, k=current.k, c=current.c, ranks=current.ranks)
            yield layout, space.terms(index, layout)
        cands = space.candidates(index, kind)
        for i in np.argsort(cands.total, kind="stable")[:TRIES]:
            k, c = int(cands.k[i]), int(cands.c[i])
            if (kind, k, c) == (current.type, current.k, current.c):
                continue
            for roomiest in (False, True):
                placed = space.place(
                    index, kind, k, c, rest, seconds=float(cands.block[i]), roomiest=roomiest
                )
                if placed is not None:
                    yield placed
                    break
