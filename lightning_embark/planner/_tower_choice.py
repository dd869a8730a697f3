"""Whether towers pay, and which: the planner's decision behind ``towers="auto"``.

The candidates are the flat plan and, for every tower setting offered (a module and its
ratio) and every tower count tried (``H``, ``2 H`` and ``L H`` on ``H`` hosts of ``L``
ranks: one tower per host, two, one per rank), the partitioner's towers
(:func:`~._partition.partition_tables`, with the affinity when one is given) planned by
:func:`~._towers.plan_with_towers`. Every candidate is priced by the same cost model; the
cheapest wins, and towers win only when strictly cheaper than flat, so the planner never
chooses towers it prices above flat. A candidate that does not fit is recorded with why.
The comparison is kept in the plan (:class:`~lightning_embark.plan.TowerChoice`).

Which settings are offered: ``identity`` towers always (they leave the model as it is);
compressing ones change the model, so only those shown to keep accuracy
(:data:`ACCURATE_TOWER_SETTINGS`, measured by ``benchmarks/towers_quality.py``) unless the
caller names others (the user's explicit choice, as ``allow`` is for lossy compression).
With one host there is no link for towers to spare, and the plan stays flat.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from lightning_embark.errors import ConfigError, PlanInfeasibleError
from lightning_embark.plan import (
    Compression,
    TowerCandidate,
    TowerChoice,
    TowerModule,
    TowerRequest,
    load_towers,
)
from lightning_embark.planner._cost import CostModel
from lightning_embark.planner._greedy import GreedyPlanner
from lightning_embark.planner._greedy_config import PlanResult
from lightning_embark.planner._partition import FeatureAffinity, partition_tables
from lightning_embark.planner._towers import plan_with_towers


@dataclass(frozen=True, kw_only=True)
class TowerSetting:
    """A tower module and its ratio.

    Attributes:
        module: The tower module.
        output_ratio: ``D_t / O_t`` (None for ``identity``).
    """

    module: TowerModule
    output_ratio: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "module", TowerModule(self.module))
        if (self.module is TowerModule.IDENTITY) != (self.output_ratio is None):
            raise ConfigError(
                f"tower setting {self.module.value}: identity towers take no ratio, compressing "
                f"ones need one (got {self.output_ratio!r})"
            )
        if self.module is TowerModule.CUSTOM:
            raise ConfigError("a 'custom' tower module comes with its model, not from a setting")

    def label(self, count: int) -> str:
        ratio = "" if self.output_ratio is None else f" r{self.output_ratio:g}"
        return f"{count} {self.module.value} towers{ratio}"


FLAT = "flat"
IDENTITY = TowerSetting(module=TowerModule.IDENTITY)
#: Compressing settings shown to keep accuracy: within 0.001 mean validation AUC of flat
#: with the 95% paired interval's lower bound above -0.002, on Frappe and MovieLens-1M
#: over ten paired seeds (``benchmarks/towers_quality.py``,
#: docs/benchmarks.md#towers-and-accuracy-on-frappe-and-movielens-1m). None is yet: every
#: setting measured keeps accuracy on MovieLens-1M, none on Frappe (the closest, dot
#: towers at ratio 4, lose 0.002 there), so ``towers="auto"`` offers identity towers
#: alone unless a module is named.
ACCURATE_TOWER_SETTINGS: tuple[TowerSetting, ...] = ()


@dataclass(frozen=True, kw_only=True)
class TowerDecision:
    """The chosen plan (its ``tower_choice`` filled in), its towers (None: flat) and the
    comparison."""

    result: PlanResult
    towers: list[TowerRequest] | None
    choice: TowerChoice


def tower_counts(num_hosts: int, ranks_per_host: int, tables: int) -> tuple[int, ...]:
    """``H``, ``2 H`` and ``L H``, at most one tower per table; none on one host."""
    if num_hosts < 2:
        return ()
    counts = {num_hosts, 2 * num_hosts, ranks_per_host * num_hosts}
    return tuple(sorted(c for c in counts if c <= tables))


def choose_towers(
    model: CostModel,
    planner: GreedyPlanner | None = None,
    *,
    settings: Sequence[TowerSetting] = (IDENTITY,),
    affinity: FeatureAffinity | None = None,
    compression: Compression = Compression.FP32,
    flat: PlanResult | None = None,
) -> TowerDecision:
    """The cheapest of flat and the tower candidates (see the module docstring).

    Args:
        model: The cost model of the cluster and workload.
        planner: The greedy planner (its knobs plan every candidate).
        settings: The tower settings offered.
        affinity: Feature affinity for the partitioner (None: statistics-only).
        compression: Wire format of the towers' outputs.
        flat: The flat plan, when already made.
    """
    planner = planner or GreedyPlanner()
    flat = flat or planner.plan(model)
    flat_ms = flat.estimate.step_time_ms
    candidates = [TowerCandidate(label=FLAT, step_ms=flat_ms)]
    best: tuple[float, str, PlanResult, list[TowerRequest] | None] = (flat_ms, FLAT, flat, None)
    counts = tower_counts(model.num_hosts, model.ranks_per_host, len(model.spec.tables))
    for setting in settings:
        for count in counts:
            label = setting.label(count)
            common = TowerCandidate(
                label=label, towers=count, module=setting.module, output_ratio=setting.output_ratio
            )
            try:
                requests = partition_tables(
                    model,
                    count,
                    affinity=affinity,
                    module=setting.module,
                    output_ratio=setting.output_ratio,
                    compression=compression,
                )
                result = plan_with_towers(model, requests, planner)
            except (PlanInfeasibleError, ConfigError) as error:
                candidates.append(dataclasses.replace(common, note=f"does not fit: {error}"))
                continue
            step = result.estimate.step_time_ms
            candidates.append(dataclasses.replace(common, step_ms=step))
            if step < best[0]:
                best = (step, label, result, requests)
    _, chosen, winner, towers = best
    reason = _reason(candidates, chosen, flat_ms, model)
    choice = TowerChoice(chosen=chosen, reason=reason, candidates=tuple(candidates))
    plan = dataclasses.replace(winner.plan, tower_choice=choice)
    return TowerDecision(
        result=dataclasses.replace(winner, plan=plan), towers=towers, choice=choice
    )


def _reason(
    candidates: Sequence[TowerCandidate], chosen: str, flat_ms: float, model: CostModel
) -> str:
    priced = [c for c in candidates if c.towers and c.step_ms is not None]
    if model.num_hosts < 2:
        return "one host: no cross-host link for towers to spare"
    if not priced:
        return "no tower candidate was offered that fits"
    cheapest = min(priced, key=lambda c: c.step_ms or 0.0)
    assert cheapest.step_ms is not None
    if chosen == FLAT:
        return (
            f"every tower candidate is estimated at or above flat's {flat_ms:.3f} ms; the "
            f"cheapest, {cheapest.label}, at {cheapest.step_ms / flat_ms:.3f}x"
        )
    return (
        f"estimated {cheapest.step_ms:.3f} ms, {cheapest.step_ms / flat_ms:.3f}x flat's "
        f"{flat_ms:.3f} ms, the cheapest of {len(priced) + 1} priced candidates"
    )


def offered_settings(
    module: TowerModule | None, output_ratio: float | None
) -> tuple[TowerSetting, ...]:
    """What ``towers="auto"`` may choose from: identity towers and
    :data:`ACCURATE_TOWER_SETTINGS` when no module is named; the named module at its ratio
    alone (the user's explicit choice) otherwise."""
    if module is None:
        return (IDENTITY, *ACCURATE_TOWER_SETTINGS)
    return (TowerSetting(module=module, output_ratio=output_ratio),)


def resolve_towers(
    model: CostModel,
    towers: int | str | Path | Sequence[TowerRequest],
    *,
    module: TowerModule | None = None,
    output_ratio: float | None = None,
    compression: Compression = Compression.FP32,
    planner: GreedyPlanner | None = None,
) -> list[TowerRequest]:
    """Tower requests from what a user wrote: a count (also as digits, as a command line
    gives it) partitioned by :func:`partition_tables` (statistics-only) with ``module``
    (default identity) / ``output_ratio`` / ``compression``; ``"auto"``: the planner's
    decision (:func:`choose_towers` over :func:`offered_settings`; an empty list when flat
    is cheaper); a ``towers.json`` path (e.g. from ``embark-towers``, which learns the
    affinity) or requests as they are.

    Raises:
        ConfigError: a string that is neither ``"auto"`` nor an existing file; tower
            module options given with a towers file (which says its own modules).
    """
    if towers == "auto":
        settings = offered_settings(module, output_ratio)
        decision = choose_towers(model, planner, settings=settings, compression=compression)
        return decision.towers or []
    if isinstance(towers, str) and towers.isdigit():
        towers = int(towers)
    if not isinstance(towers, int | str | Path):
        return list(towers)
    if isinstance(towers, int):
        return partition_tables(
            model,
            towers,
            module=module or TowerModule.IDENTITY,
            output_ratio=output_ratio,
            compression=compression,
        )
    if not Path(towers).is_file():
        raise ConfigError(
            f"towers {str(towers)!r} is neither 'auto', a tower count nor an existing "
            "towers.json file"
        )
    if module not in (None, TowerModule.IDENTITY) or output_ratio is not None:
        raise ConfigError(
            f"towers file {str(towers)!r} names each tower's module and width; drop the tower "
            f"module options ({module and module.value}, ratio {output_ratio})"
        )
    return load_towers(towers)
