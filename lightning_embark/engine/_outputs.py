"""Where each of the engine's output keys comes from: a flat feature, or the towers' output.

The engine's output is ``[B, sum(widths)]`` in model order: the pooled vector of every
feature outside a non-identity tower (a feature of an identity tower comes back, pooled,
inside the towers' output), then one output per non-identity tower. :func:`output_slots`
maps each key to its source once, at construction; forward and backward read it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lightning_embark.engine._routing import FeatureInfo
from lightning_embark.plan import TowerModule

#: ``(key, width, (kind, index))``: kind ``"feature"`` (index: the feature's position) or
#: ``"tower"`` (index: the first column in the towers' output).
Slot = tuple[str, int, tuple[str, int]]


def output_slots(
    features: Sequence[FeatureInfo], feature_dims: Sequence[int], towers: Sequence[Any]
) -> list[Slot]:
    """``(key, width, source)`` per output key, in output order.

    Args:
        features: The engine's features, in model order.
        feature_dims: Each feature's pooled width.
        towers: The tower stage's towers (each with ``plan``, ``positions``, ``dims``,
            ``out_offset`` and ``out_dim``); empty without towers.
    """
    column_of: dict[int, int] = {}
    hidden: set[int] = set()
    for tower in towers:
        if tower.plan.module is TowerModule.IDENTITY:
            start = tower.out_offset
            for position, dim in zip(tower.positions, tower.dims, strict=True):
                column_of[position] = start
                start += dim
        else:
            hidden.update(tower.positions)
    slots: list[Slot] = []
    for i, (f, dim) in enumerate(zip(features, feature_dims, strict=True)):
        if i in column_of:
            slots.append((f.name, dim, ("tower", column_of[i])))
        elif i not in hidden:
            slots.append((f.name, dim, ("feature", i)))
    slots += [
        (t.plan.name, t.out_dim, ("tower", t.out_offset))
        for t in towers
        if t.plan.module is not TowerModule.IDENTITY
    ]
    return slots
