"""Why a plan has the towers it has: the comparison the planner made for ``towers="auto"``.

The planner prices the flat plan and every tower candidate it may offer (a module, a
ratio and a number of towers) under the same cost model, and keeps the cheapest; towers
only when they are cheaper than flat. :class:`TowerChoice` records that comparison in
the plan (``Plan.tower_choice``), so a plan file, a log line and ``embark-plan`` all say
why towers were chosen or not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lightning_embark.errors import ConfigError
from lightning_embark.plan._towers import TowerModule

FLAT = "flat"


@dataclass(frozen=True, kw_only=True)
class TowerCandidate:
    """One option the planner priced.

    Attributes:
        label: ``"flat"`` or e.g. ``"4 dot towers r4"``.
        towers: How many towers (0: flat).
        module: The tower module (None: flat).
        output_ratio: Its ratio (None: flat or identity).
        step_ms: The estimated step; None when the candidate does not fit.
        note: Why it does not fit, or nothing.
    """

    label: str
    towers: int = 0
    module: TowerModule | None = None
    output_ratio: float | None = None
    step_ms: float | None = None
    note: str = ""

    def __post_init__(self) -> None:
        if self.module is not None:
            object.__setattr__(self, "module", TowerModule(self.module))


@dataclass(frozen=True, kw_only=True)
class TowerChoice:
    """The comparison behind a plan's towers (see the module docstring).

    Attributes:
        chosen: The label of the candidate the plan is.
        reason: One sentence: why that one.
        candidates: Everything priced, flat first.
    """

    chosen: str
    reason: str
    candidates: tuple[TowerCandidate, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "candidates", tuple(self.candidates))
        labels = [c.label for c in self.candidates]
        if self.chosen not in labels:
            raise ConfigError(f"tower choice {self.chosen!r} is not among its candidates {labels}")

    @property
    def flat_ms(self) -> float | None:
        """The flat plan's estimated step."""
        return next((c.step_ms for c in self.candidates if c.towers == 0), None)

    def table(self) -> str:
        """The candidates as printed: estimated step, its ratio to flat, and notes."""
        flat = self.flat_ms
        lines = [f"{'candidate':<28}{'est. step ms':>13}{'x flat':>8}  note"]
        for c in self.candidates:
            step = "-" if c.step_ms is None else f"{c.step_ms:.3f}"
            ratio = "-" if c.step_ms is None or not flat else f"{c.step_ms / flat:.3f}"
            mark = " <- chosen" if c.label == self.chosen else ""
            lines.append(f"{c.label:<28}{step:>13}{ratio:>8}  {c.note}{mark}".rstrip())
        return "\n".join([*lines, f"towers: {self.chosen} ({self.reason})"])

    @classmethod
    def from_dict(cls, data: Any) -> TowerChoice:
        """Inverse of the plan's JSON (``Plan.to_dict``)."""
        try:
            return cls(
                chosen=data["chosen"],
                reason=data["reason"],
                candidates=tuple(TowerCandidate(**c) for c in data["candidates"]),
            )
        except (KeyError, TypeError, ValueError) as error:
            raise ConfigError(f"malformed tower_choice in plan JSON: {error}") from error
