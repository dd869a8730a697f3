"""Plain-torch stores: the fallback where fbgemm's kernels do not run, and grouping.

:class:`TorchStore` keeps plain tensors, pools with ``embedding_bag`` and applies
the optimizer explicitly (the formulas of
:class:`~lightning_embark.engine._optimizer.SparseOptimizer`).
:class:`GroupedStore` puts several stores behind one (one kernel call per part).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from lightning_embark.engine._optimizer import OptimizerKind, SparseOptimizer
from lightning_embark.engine.stores._base import (
    Bags,
    ShardStore,
    copy_optimizer_states,
    padded_row_grads,
)


class TorchStore(ShardStore):
    """Plain tensors, ``embedding_bag`` lookup and an explicit optimizer update.

    Args:
        shapes: ``(rows, width)`` per block.
        optimizer: The sparse optimizer.
        device: Where the weights and optimizer state live (the engine's device); the
            bags it is given must be there too.
    """

    def __init__(
        self,
        shapes: Sequence[tuple[int, int]],
        optimizer: SparseOptimizer,
        *,
        device: torch.device | str = "cpu",
    ) -> None:
        super().__init__(shapes, optimizer)
        self.device = torch.device(device)
        # One scratch row past each block's rows (row ``r``): the padding of the pooled
        # update's static-size rows lands there (:meth:`backward_pooled`).
        self._padded = [torch.zeros(r + 1, w, device=self.device) for r, w in self.shapes]
        self._weights = [p[:r] for p, (r, _) in zip(self._padded, self.shapes, strict=True)]
        kind = optimizer.kind
        self._padded_state: list[torch.Tensor | None]
        if kind is OptimizerKind.ADAGRAD:
            self._padded_state = [
                torch.zeros(r + 1, w, device=self.device) for r, w in self.shapes
            ]
        elif kind is OptimizerKind.ROWWISE_ADAGRAD:
            self._padded_state = [torch.zeros(r + 1, device=self.device) for r, _ in self.shapes]
        else:
            self._padded_state = [None for _ in self.shapes]
        self._state = [
            s[:r] if s is not None else None
            for s, (r, _) in zip(self._padded_state, self.shapes, strict=True)
        ]

    def pooled(
        self, bags: Sequence[Bags], *, keep_for_backward: bool
    ) -> tuple[list[torch.Tensor], Any]:
        out = [
            F.embedding_bag(b.indices, w, b.offsets[:-1], mode="sum", per_sample_weights=b.weights)
            if b.num_bags
            else w.new_zeros(0, w.shape[1])
            for w, b in zip(self._weights, bags, strict=True)
        ]
        return out, None

    def backward_pooled(
        self, handle: Any, bags: Sequence[Bags], grads: Sequence[torch.Tensor]
    ) -> None:
        """The update of every block with no host read: each block's rows and summed
        gradients at a static size (:func:`padded_row_grads`, padded with the block's
        scratch row and a zero gradient), applied to the padded tensors."""
        rows, summed = [], []
        for (r, _), b, g in zip(self.shapes, bags, grads, strict=True):
            block_rows, block_grads = padded_row_grads(b, g, pad_row=r)
            rows.append(block_rows)
            summed.append(block_grads)
        self._apply(self._padded, self._padded_state, rows, summed, None)

    def apply_row_grads(
        self,
        rows: Sequence[torch.Tensor],
        grads: Sequence[torch.Tensor],
        row_sq_means: Sequence[torch.Tensor | None] | None = None,
    ) -> None:
        self._apply(self._weights, self._state, rows, grads, row_sq_means)

    def _apply(
        self,
        weights: Sequence[torch.Tensor],
        states: Sequence[torch.Tensor | None],
        rows: Sequence[torch.Tensor],
        grads: Sequence[torch.Tensor],
        row_sq_means: Sequence[torch.Tensor | None] | None,
    ) -> None:
        """The optimizer's formulas for rows ``rows[t]`` (distinct, but for scratch rows)
        of block ``t`` with their summed gradients."""
        lr, eps = self.optimizer.lr, self.optimizer.eps
        means = row_sq_means if row_sq_means is not None else [None] * len(rows)
        for w, state, r, g, m in zip(weights, states, rows, grads, means, strict=True):
            if r.numel() == 0:
                continue
            if self.optimizer.kind is OptimizerKind.SGD:
                w.index_add_(0, r, g, alpha=-lr)
                continue
            assert state is not None  # Adagrad and row-wise Adagrad keep one
            if self.optimizer.kind is OptimizerKind.ADAGRAD:
                s = state[r] + g * g
                state[r] = s
                w[r] -= lr * g / (s.sqrt() + eps)
            else:
                s = state[r] + ((g * g).mean(1) if m is None else m)
                state[r] = s
                w[r] -= lr * g / (s.sqrt() + eps).unsqueeze(1)

    def weights(self) -> list[torch.Tensor]:
        return list(self._weights)

    def load(self, weights: Sequence[torch.Tensor]) -> None:
        for w, src in zip(self._weights, weights, strict=True):
            w.copy_(src)

    def optimizer_state(self) -> list[torch.Tensor | None]:
        return list(self._state)

    def load_optimizer_state(self, states: Sequence[torch.Tensor | None]) -> None:
        copy_optimizer_states(self._state, states)


class GroupedStore(ShardStore):
    """Blocks partitioned over several stores, one kernel call per part.

    fbgemm pads every block of a call to the largest bag count; UB owners answer
    very different numbers of rows per block, so they keep one kernel per block.
    """

    def __init__(self, stores: Sequence[ShardStore], groups: Sequence[Sequence[int]]) -> None:
        shapes: list[tuple[int, int]] = [(0, 0)] * sum(len(g) for g in groups)
        for store, group in zip(stores, groups, strict=True):
            for i, shape in zip(group, store.shapes, strict=True):
                shapes[i] = shape
        super().__init__(shapes, stores[0].optimizer if stores else SparseOptimizer())
        self.stores = list(stores)
        self.groups = [list(g) for g in groups]

    def _split(self, items: Sequence[Any]) -> list[list[Any]]:
        return [[items[i] for i in group] for group in self.groups]

    def _merge(self, parts: Sequence[Sequence[Any]]) -> list[Any]:
        out: list[Any] = [None] * len(self.shapes)
        for group, part in zip(self.groups, parts, strict=True):
            for i, item in zip(group, part, strict=True):
                out[i] = item
        return out

    def pooled(
        self, bags: Sequence[Bags], *, keep_for_backward: bool
    ) -> tuple[list[torch.Tensor], Any]:
        results = [
            s.pooled(b, keep_for_backward=keep_for_backward)
            for s, b in zip(self.stores, self._split(bags), strict=False)
        ]
        return self._merge([r[0] for r in results]), [r[1] for r in results]

    def backward_pooled(
        self, handle: Any, bags: Sequence[Bags], grads: Sequence[torch.Tensor]
    ) -> None:
        for store, h, b, g in zip(
            self.stores, handle, self._split(bags), self._split(grads), strict=True
        ):
            store.backward_pooled(h, b, g)

    def apply_row_grads(
        self,
        rows: Sequence[torch.Tensor],
        grads: Sequence[torch.Tensor],
        row_sq_means: Sequence[torch.Tensor | None] | None = None,
    ) -> None:
        means = (
            self._split(row_sq_means) if row_sq_means is not None else [None] * len(self.stores)
        )
        for store, r, g, m in zip(
            self.stores, self._split(rows), self._split(grads), means, strict=True
        ):
            store.apply_row_grads(r, g, m)

    def weights(self) -> list[torch.Tensor]:
        return self._merge([s.weights() for s in self.stores])

    def load(self, weights: Sequence[torch.Tensor]) -> None:
        for store, w in zip(self.stores, self._split(weights), strict=True):
            store.load(w)

    def optimizer_state(self) -> list[torch.Tensor | None]:
        return self._merge([s.optimizer_state() for s in self.stores])

    def load_optimizer_state(self, states: Sequence[torch.Tensor | None]) -> None:
        for store, part in zip(self.stores, self._split(states), strict=True):
            store.load_optimizer_state(part)
