"""Tower requests: the towers a user or a partitioner asks for, before planning.

A :class:`TowerRequest` names a tower's tables and module and, optionally, its host
and output width; the planner turns requests into the plan's
:class:`~lightning_embark.plan.TowerPlan` s (hosts chosen, layouts made, widths
settled). Requests travel as ``towers.json`` (:mod:`._tower_file`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lightning_embark.errors import ConfigError
from lightning_embark.plan._kinds import Compression
from lightning_embark.plan._towers import TowerModule, TowerPlan, dot_pairs


@dataclass(frozen=True, kw_only=True)
class TowerRequest:
    """A tower to plan.

    Attributes:
        name: The tower's name.
        tables: Its tables (the spec's names).
        host: Its host, or None for the planner to choose.
        module: The tower module's kind.
        output_dim: Output width ``O_t``; None: from ``output_ratio`` (identity: none).
        output_ratio: ``D_t / O_t`` when ``output_dim`` is not given (rounded, at
            least 1 wide).
        forward_compression: Wire format of the output crossing back.
        backward_compression: Wire format of its gradient.
    """

    name: str
    tables: tuple[str, ...]
    host: int | None = None
    module: TowerModule = TowerModule.IDENTITY
    output_dim: int | None = None
    output_ratio: float | None = None
    forward_compression: Compression = Compression.FP32
    backward_compression: Compression = Compression.FP32

    def __post_init__(self) -> None:
        object.__setattr__(self, "tables", tuple(self.tables))
        object.__setattr__(self, "module", TowerModule(self.module))
        if self.module is TowerModule.IDENTITY and (
            self.output_dim is not None or self.output_ratio is not None
        ):
            raise ConfigError(
                f"tower {self.name!r}: an identity tower has no output width or ratio"
            )
        if self.module is not TowerModule.IDENTITY and (
            (self.output_dim is None) == (self.output_ratio is None)
        ):
            raise ConfigError(
                f"tower {self.name!r}: give exactly one of output_dim and output_ratio for a "
                f"{self.module.value} tower"
            )
        if self.output_ratio is not None and not self.output_ratio >= 1:
            raise ConfigError(
                f"tower {self.name!r}: output_ratio is D_t / O_t and must be >= 1, got "
                f"{self.output_ratio!r}"
            )

    def output_width(self, dims: Sequence[int]) -> int | None:
        """``O_t`` for tables of widths ``dims`` (None for identity towers without one).

        From a ratio ``R``: when every table has one width ``d`` (as a DLRM's
        interaction needs, reading the output as ``d``-wide vectors), a whole number of
        vectors, ``O_t = d * max(1, round(n / R))``; otherwise ``max(1, round(D_t / R))``.
        A ``dot`` tower's projection is that wide and its ``n (n - 1) / 2`` pair terms
        come on top (so its ``D_t / O_t`` is below ``R``). The planner and the model use
        this one rule, so the plan prices the width the model builds.

        Raises:
            ConfigError: a ``dot`` tower over tables of different widths.
        """
        if self.output_dim is not None or self.output_ratio is None:
            return self.output_dim
        if self.module is TowerModule.DOT and len(set(dims)) > 1:
            raise ConfigError(
                f"tower {self.name!r}: a dot tower's features need one width, got "
                f"{sorted(set(dims))}; use a projection tower or tables of one width"
            )
        if len(set(dims)) == 1:
            vectors = dims[0] * max(1, round(len(dims) / self.output_ratio))
            extra = dot_pairs(len(dims)) if self.module is TowerModule.DOT else 0
            return vectors + extra
        return max(1, round(sum(dims) / self.output_ratio))

    def resolved(self, dims: Sequence[int], host: int) -> TowerPlan:
        """The plan's tower for this request, on ``host``, with its width settled from
        its tables' widths ``dims`` (:meth:`output_width`)."""
        out = self.output_width(dims)
        return TowerPlan(
            name=self.name,
            host=host,
            tables=self.tables,
            module=self.module,
            output_dim=out,
            forward_compression=self.forward_compression,
            backward_compression=self.backward_compression,
        )

    @classmethod
    def of(cls, tower: TowerPlan) -> TowerRequest:
        """The request a planned tower answers: its tables, host, module, width and wire."""
        return cls(
            name=tower.name,
            tables=tower.tables,
            host=tower.host,
            module=tower.module,
            output_dim=tower.output_dim,
            forward_compression=Compression(tower.forward_compression),
            backward_compression=Compression(tower.backward_compression),
        )
