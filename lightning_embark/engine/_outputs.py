"""Where each of the engine's output keys comes from: a flat feature, or the towers' output.

The engine's output is ``[B, sum(widths)]`` in model order: the pooled vector of every
feature outside a non-identity tower (a feature of an identity tower comes back, pooled,
inside the towers' output), then one output per non-identity tower. Each cluster returns
its features' pooled vectors side by side (``[B, sum(d)]`` in its own feature order) and
the towers theirs; :class:`OutputLayout`, made once at construction, puts the output
together from those sources with at most one gather of column chunks (none when the
sources already lie in output order), and cuts the output's gradient back apart with the
inverse gather.
"""

from __future__ import annotations

import math
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


class OutputLayout:
    """The engine's output from its sources (every cluster's pooled columns, then the
    towers'), and the adjoint.

    Args:
        slots: :func:`output_slots`.
        clusters: Each cluster's feature positions, in its column order.
        feature_dims: Each feature's pooled width.
        towers_width: Columns of the towers' output (0 without towers).
        device: The engine's device.
    """

    def __init__(
        self,
        slots: Sequence[Slot],
        clusters: Sequence[Sequence[int]],
        feature_dims: Sequence[int],
        towers_width: int,
        device: torch.device,
    ) -> None:
        source_of: dict[int, int] = {}
        start = 0
        self.widths: list[int] = []
        for positions in clusters:
            width = 0
            for p in positions:
                source_of[p] = start + width
                width += feature_dims[p]
            self.widths.append(width)
            start += width
        self.widths.append(towers_width)
        towers_start = start
        spans = [
            (source_of[index] if kind == "feature" else towers_start + index, width)
            for _, width, (kind, index) in slots
        ]
        self.total = start + towers_width
        self.width = sum(w for _, w in spans)
        columns = [c for s, w in spans for c in range(s, s + w)]
        if columns == list(range(self.total)):
            self._index: torch.Tensor | None = None
            self._inverse: torch.Tensor | None = None
            self.chunk = 1
            return
        assert sorted(columns) == list(range(self.total)), "every source column is output once"
        # Gather whole chunks of ``chunk`` columns (one table's width, typically).
        self.chunk = math.gcd(*[x for s, w in spans for x in (s, w)], self.total) or 1
        chunks = [c // self.chunk for c in columns[:: self.chunk]]
        self._index = torch.tensor(chunks, dtype=torch.int64, device=device)
        inverse = [0] * len(chunks)
        for out, src in enumerate(chunks):
            inverse[src] = out
        self._inverse = torch.tensor(inverse, dtype=torch.int64, device=device)

    def assemble(
        self, pooled: Sequence[torch.Tensor | None], towers: torch.Tensor
    ) -> torch.Tensor:
        """The output ``[B, sum(widths)]`` from each cluster's pooled columns and the
        towers' output."""
        parts = [p for p in pooled if p is not None]
        if towers.shape[1]:
            parts.append(towers)
        rows = towers.shape[0]
        if not parts:
            return towers.new_zeros(rows, 0)
        source = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
        if self._index is None:
            return source
        return _chunks(source, self.chunk).index_select(1, self._index).reshape(rows, self.width)

    def split_grad(self, grad: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        """The output's gradient cut per source: one ``[B, sum(d)]`` per cluster and the
        towers' ``[B, sum(O_t)]`` (the adjoint of :meth:`assemble`)."""
        rows = grad.shape[0]
        if self._inverse is not None:
            grad = (
                _chunks(grad, self.chunk).index_select(1, self._inverse).reshape(rows, self.total)
            )
        parts = list(torch.split(grad, self.widths, dim=1))
        return parts[:-1], parts[-1]


def _chunks(x: torch.Tensor, chunk: int) -> torch.Tensor:
    """``[B, C]`` seen as ``[B, C / chunk, chunk]``."""
    return x.reshape(x.shape[0], x.shape[1] // chunk, chunk)
