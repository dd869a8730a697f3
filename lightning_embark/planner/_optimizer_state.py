"""How much memory the sparse optimizer's state takes, as the planner counts it.

The engine keeps the optimizer state beside each block in float32: nothing for SGD,
one float per row for row-wise Adagrad, one per element for Adagrad (as much as the
weights: a row's bytes double). For a model near the memory limit the choice decides
whether it fits, so planning must know the optimizer training will use; the
calibration's ``optimizer_bytes_per_element`` / ``optimizer_bytes_per_row`` carry it
into every memory term (:meth:`~lightning_embark.planner.Calibration.bytes_per_element`
for :meth:`~lightning_embark.plan.Plan.validate`, the split and placement budgets).
"""

from __future__ import annotations

import dataclasses

from lightning_embark.errors import ConfigError, PlanInfeasibleError
from lightning_embark.planner._hardware import Calibration

#: Optimizer-state bytes per embedding element and per row, by sparse optimizer.
SPARSE_OPTIMIZER_STATE: dict[str, tuple[float, float]] = {
    "sgd": (0.0, 0.0),
    "adagrad": (4.0, 0.0),
    "rowwise_adagrad": (0.0, 4.0),
}
#: The sparse optimizers the engine runs; the planner's default is the first.
SPARSE_OPTIMIZER_KINDS = ("rowwise_adagrad", "adagrad", "sgd")
DEFAULT_SPARSE_OPTIMIZER = "rowwise_adagrad"


def _check(kind: str) -> tuple[float, float]:
    try:
        return SPARSE_OPTIMIZER_STATE[str(kind)]
    except KeyError:
        raise ConfigError(
            f"sparse optimizer {kind!r} is unknown; use one of {list(SPARSE_OPTIMIZER_KINDS)}"
        ) from None


def state_text(kind: str) -> str:
    """What ``kind``'s state costs, in words, for messages."""
    per_element, per_row = _check(kind)
    if per_element:
        return f"{kind} keeps {per_element:g} bytes of state per element, doubling each row"
    if per_row:
        return f"{kind} keeps {per_row:g} bytes of state per row"
    return f"{kind} keeps no state"


def with_sparse_optimizer(calib: Calibration, kind: str) -> Calibration:
    """``calib`` with the optimizer-state bytes of the sparse optimizer ``kind``.

    Raises:
        ConfigError: ``kind`` is not one of :data:`SPARSE_OPTIMIZER_KINDS`.
    """
    per_element, per_row = _check(kind)
    return dataclasses.replace(
        calib, optimizer_bytes_per_element=per_element, optimizer_bytes_per_row=per_row
    )


def explain_state(error: PlanInfeasibleError, kind: str, *, how: str) -> PlanInfeasibleError:
    """``error`` with what the sparse optimizer's state added, and how to choose another.

    Args:
        error: The planner's memory error.
        kind: The sparse optimizer the plan was made for.
        how: How the caller chooses it (``--sparse-optimizer``, ``sparse_optimizer=``).
    """
    others = ", ".join(state_text(k) for k in SPARSE_OPTIMIZER_KINDS if k != kind)
    return PlanInfeasibleError(
        f"{error}; memory includes the sparse optimizer's state for {how} {kind}: "
        f"{state_text(kind)} ({others})",
        table=error.table,
        shortfall_bytes=error.shortfall_bytes,
    )
