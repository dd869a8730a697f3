"""Where each of the engine's output keys comes from: a flat feature, or the towers' output.

The engine's output is ``[B, sum(widths)]`` in model order: the pooled vector of every
feature outside a non-identity tower (a feature of an identity tower comes back, pooled,
inside the towers' output), then one output per non-identity tower. :func:`output_slots`
maps each key to its source once, at construction; forward puts the output together from
it (:func:`assemble`) and backward cuts the output's gradient back apart
(:func:`split_grad`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

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


def assemble(
    slots: Sequence[Slot],
    pooled: dict[int, torch.Tensor],
    towers: torch.Tensor,
) -> torch.Tensor:
    """The engine's output ``[B, sum(widths)]``: each slot's columns, from the features'
    ``pooled`` vectors (by position) or the towers' output ``[B, sum(O_t)]``."""
    parts = [
        pooled[index] if kind == "feature" else towers[:, index : index + width]
        for _, width, (kind, index) in slots
    ]
    return torch.cat(parts, dim=1) if parts else towers.new_zeros(towers.shape[0], 0)


def split_grad(
    slots: Sequence[Slot], grad: torch.Tensor, num_features: int
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """The output's gradient cut per slot: one ``[B, d]`` per feature position (empty for
    features inside a tower) and the towers' ``[B, sum(O_t)]`` (the adjoint of
    :func:`assemble`)."""
    parts = torch.split(grad, [width for _, width, _ in slots], dim=1)
    grads: list[torch.Tensor] = [grad.new_empty(0)] * num_features
    tower_grads: list[tuple[int, torch.Tensor]] = []
    for (_, _, (kind, index)), g in zip(slots, parts, strict=True):
        if kind == "feature":
            grads[index] = g
        else:
            tower_grads.append((index, g))
    tower_grads.sort(key=lambda pair: pair[0])
    towers = (
        torch.cat([g for _, g in tower_grads], dim=1)
        if tower_grads
        else grad.new_zeros(grad.shape[0], 0)
    )
    return grads, towers
