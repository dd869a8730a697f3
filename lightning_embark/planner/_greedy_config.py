"""What the greedy planner takes and returns: its knobs, its result, its plug point.

:class:`GreedyConfig` is checked on construction, so a bad knob fails where it is set
rather than deep in a plan; :class:`PlanResult` and :class:`Planner` are shared with the
planners built on the greedy one (towers). Kept apart from
:mod:`~lightning_embark.planner._greedy` so the knobs read without the search, and the
layout helpers (:mod:`~lightning_embark.planner._greedy_layout`) can take them without
importing the planner.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lightning_embark.errors import ConfigError
from lightning_embark.plan import Compression, Plan
from lightning_embark.planner._cost import CostModel, Estimate


@dataclass(frozen=True, kw_only=True)
class GreedyConfig:
    """Knobs of the greedy planner.

    Attributes:
        allow: Compressions the planner may choose (default lossless only).
        memory_fraction: Share of each rank's memory for weights and optimizer state;
            the rest is headroom for exchange buffers.
        dp_fraction: Share of each rank's memory that replicated (DP) tables may take.
        min_col_width: Narrowest column shard worth a block.
        targets: Load targets tried, as multiples of the mean per-rank load.
        dp: Whether tables may be data parallel.
        hierarchical: Force hierarchical exchange on/off; None chooses per cluster.
        ub_threshold: A table is unique-based when its unique rows cost less than
            ``ub_threshold`` times its pooled rows on the wire (1: whichever moves fewer
            bytes; above 1 favours UB, below 1 favours RB).
        max_row_shards: Cap on a table's row shards ``k``; None: up to the world.
        max_col_shards: Cap on a table's column shards ``c``; None: as the width allows.
        uvm_caching: When no plan fits HBM and the hardware has a host link (GPU
            presets), place the overflowing ranks' sharded blocks in UVM behind HBM
            caches (:mod:`._uvm`) instead of failing.
    """

    allow: tuple[Compression, ...] = (Compression.FP32,)
    memory_fraction: float = 0.9
    dp_fraction: float = 0.1
    min_col_width: int = 16
    targets: tuple[float, ...] = (1.0, 0.5, 0.25)
    dp: bool = True
    hierarchical: bool | None = None
    ub_threshold: float = 1.0
    max_row_shards: int | None = None
    max_col_shards: int | None = None
    uvm_caching: bool = True

    def __post_init__(self) -> None:
        allow = tuple(Compression(a) for a in self.allow)
        if not allow:
            raise ConfigError("GreedyConfig.allow is empty; allow at least 'fp32'")
        object.__setattr__(self, "allow", tuple(sorted(set(allow), key=list(Compression).index)))
        for name in ("memory_fraction", "dp_fraction"):
            if not 0 < getattr(self, name) <= 1:
                raise ConfigError(
                    f"GreedyConfig.{name} must be in (0, 1], got {getattr(self, name)!r}"
                )
        if self.min_col_width < 1:
            raise ConfigError(
                f"GreedyConfig.min_col_width must be >= 1, got {self.min_col_width!r}"
            )
        if not self.ub_threshold > 0:
            raise ConfigError(
                f"GreedyConfig.ub_threshold must be positive, got {self.ub_threshold!r}"
            )
        for name in ("max_row_shards", "max_col_shards"):
            cap = getattr(self, name)
            if cap is not None and (not isinstance(cap, int) or cap < 1):
                raise ConfigError(f"GreedyConfig.{name} must be None or >= 1, got {cap!r}")
        if not self.targets or any(t <= 0 for t in self.targets):
            raise ConfigError(
                f"GreedyConfig.targets must be positive multiples, got {self.targets!r}"
            )


@dataclass(frozen=True, kw_only=True)
class PlanResult:
    """A plan, its estimate under the model that produced it, and the planning time."""

    plan: Plan
    estimate: Estimate
    planning_seconds: float
    notes: tuple[str, ...] = field(default_factory=tuple)


class Planner:
    """One plug point: turns a cost model's model and cluster into a plan."""

    def plan(self, model: CostModel) -> PlanResult:
        raise NotImplementedError
