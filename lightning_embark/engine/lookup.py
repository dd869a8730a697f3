"""Owner-side storage of embedding blocks: pooled lookup and the sparse optimizer.

A :class:`ShardStore` holds the blocks one rank owns for one cluster and answers
bags of local row indices with summed rows. Owners always *sum*: mean pooling and
per-sample weights are applied where the whole bag is known (mean at the
requester; weights travel with the IDs), so a bag split over row shards still
pools exactly.

Two ways to update, because replicated blocks need their gradients combined
across replicas first:

* :meth:`ShardStore.backward_pooled` - the fused path: the pooled gradient goes
  straight into the kernel's backward, which computes row gradients and applies
  the optimizer in one pass (fbgemm's ``EXACT_*`` optimizers de-duplicate rows).
* :meth:`ShardStore.apply_row_grads` - the explicit path: apply already summed
  gradients of unique rows (after a replica sync or a DP all-reduce).

Implementations: ``FbgemmStore`` (``tbe.py``: fbgemm's table-batched kernels) and
:class:`TorchStore` (``embedding_bag`` plus an explicit update; the fallback).
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from lightning_embark.errors import ConfigError


class OptimizerKind(enum.StrEnum):
    SGD = "sgd"
    ADAGRAD = "adagrad"
    ROWWISE_ADAGRAD = "rowwise_adagrad"


@dataclass(frozen=True, kw_only=True)
class SparseOptimizer:
    """The optimizer applied to embedding rows at their owners (fused into backward).

    ``adagrad``: ``s += g**2; w -= lr * g / (sqrt(s) + eps)`` element-wise;
    ``rowwise_adagrad``: one ``s`` per row, ``s += mean(g**2)`` over the row's
    columns (per column shard when a table is split by columns, as in torchrec).
    """

    kind: OptimizerKind = OptimizerKind.SGD
    lr: float = 0.01
    eps: float = 1e-8

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "kind", OptimizerKind(self.kind))
        except ValueError:
            raise ConfigError(
                f"sparse optimizer kind {self.kind!r} is unknown; use one of {[k.value for k in OptimizerKind]}"
            ) from None
        if not self.lr > 0:
            raise ConfigError(f"sparse optimizer lr must be > 0, got {self.lr!r}")
        if not self.eps > 0:
            raise ConfigError(f"sparse optimizer eps must be > 0 (it guards 0/0), got {self.eps!r}")


@dataclass(frozen=True, kw_only=True)
class Bags:
    """Bags of local row indices for one block: ``offsets`` has ``num_bags + 1`` entries."""

    indices: torch.Tensor
    offsets: torch.Tensor
    weights: torch.Tensor | None = None

    @property
    def num_bags(self) -> int:
        return self.offsets.numel() - 1


def row_grads(bags: Bags, pooled_grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Unique rows of ``bags`` and their summed gradient, given the bags' pooled gradient."""
    lengths = bags.offsets[1:] - bags.offsets[:-1]
    bag_of = torch.repeat_interleave(torch.arange(bags.num_bags), lengths)
    contrib = pooled_grad[bag_of]
    if bags.weights is not None:
        contrib = contrib * bags.weights.unsqueeze(1)
    rows, inverse = torch.unique(bags.indices, return_inverse=True)
    summed = torch.zeros(rows.numel(), pooled_grad.shape[1], dtype=pooled_grad.dtype)
    return rows, summed.index_add_(0, inverse, contrib)


class ShardStore(ABC):
    """The blocks one rank owns for one cluster (a tiny plug point: two kernels)."""

    def __init__(self, shapes: Sequence[tuple[int, int]], optimizer: SparseOptimizer) -> None:
        self.shapes = [(int(r), int(w)) for r, w in shapes]
        self.optimizer = optimizer

    @abstractmethod
    def pooled(self, bags: Sequence[Bags], *, keep_for_backward: bool) -> tuple[list[torch.Tensor], Any]:
        """Sum-pool each block's bags; returns ``[num_bags, width]`` per block and a handle."""

    def backward_pooled(self, handle: Any, bags: Sequence[Bags], grads: Sequence[torch.Tensor]) -> None:
        """Apply the optimizer for the pooled gradients of a :meth:`pooled` call."""
        rows, summed = zip(*(row_grads(b, g) for b, g in zip(bags, grads, strict=True))) if bags else ((), ())
        self.apply_row_grads(list(rows), list(summed))

    @abstractmethod
    def apply_row_grads(
        self,
        rows: Sequence[torch.Tensor],
        grads: Sequence[torch.Tensor],
        row_sq_means: Sequence[torch.Tensor | None] | None = None,
    ) -> None:
        """Apply the optimizer to unique local ``rows[b]`` of block ``b`` with summed ``grads[b]``.

        ``row_sq_means[b]`` (row-wise Adagrad only) replaces the block's own
        ``mean(g**2)`` per row: a column-split table passes the mean over the *whole*
        row, gathered from its column shards, so its state matches the unsharded one.
        """

    @abstractmethod
    def weights(self) -> list[torch.Tensor]:
        """The blocks' current weights (views; do not modify)."""

    @abstractmethod
    def load(self, weights: Sequence[torch.Tensor]) -> None:
        """Overwrite the blocks' weights (optimizer state is reset by construction only)."""

    @abstractmethod
    def optimizer_state(self) -> list[torch.Tensor | None]:
        """Per block: the sparse optimizer's state (views; do not modify).

        Adagrad: ``[rows, width]`` squared-gradient sums; row-wise Adagrad: ``[rows]``;
        SGD: None. Checkpoints save it next to the weights so a resumed run continues
        with the same effective learning rates.
        """

    @abstractmethod
    def load_optimizer_state(self, states: Sequence[torch.Tensor | None]) -> None:
        """Overwrite the blocks' optimizer state (shapes as :meth:`optimizer_state`)."""


class TorchStore(ShardStore):
    """Plain tensors, ``embedding_bag`` lookup and an explicit optimizer update."""

    def __init__(self, shapes: Sequence[tuple[int, int]], optimizer: SparseOptimizer) -> None:
        super().__init__(shapes, optimizer)
        self._weights = [torch.zeros(r, w) for r, w in self.shapes]
        kind = optimizer.kind
        if kind is OptimizerKind.ADAGRAD:
            self._state = [torch.zeros(r, w) for r, w in self.shapes]
        elif kind is OptimizerKind.ROWWISE_ADAGRAD:
            self._state = [torch.zeros(r) for r, _ in self.shapes]
        else:
            self._state = [None for _ in self.shapes]

    def pooled(self, bags: Sequence[Bags], *, keep_for_backward: bool) -> tuple[list[torch.Tensor], Any]:
        out = [
            F.embedding_bag(b.indices, w, b.offsets[:-1], mode="sum", per_sample_weights=b.weights)
            if b.num_bags
            else w.new_zeros(0, w.shape[1])
            for w, b in zip(self._weights, bags, strict=True)
        ]
        return out, None

    def apply_row_grads(
        self,
        rows: Sequence[torch.Tensor],
        grads: Sequence[torch.Tensor],
        row_sq_means: Sequence[torch.Tensor | None] | None = None,
    ) -> None:
        lr, eps = self.optimizer.lr, self.optimizer.eps
        means = row_sq_means if row_sq_means is not None else [None] * len(rows)
        for w, state, r, g, m in zip(self._weights, self._state, rows, grads, means, strict=True):
            if r.numel() == 0:
                continue
            if self.optimizer.kind is OptimizerKind.SGD:
                w.index_add_(0, r, g, alpha=-lr)
                continue
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
        shapes = [None] * sum(len(g) for g in groups)
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

    def pooled(self, bags: Sequence[Bags], *, keep_for_backward: bool) -> tuple[list[torch.Tensor], Any]:
        results = [s.pooled(b, keep_for_backward=keep_for_backward) for s, b in zip(self.stores, self._split(bags))]
        return self._merge([r[0] for r in results]), [r[1] for r in results]

    def backward_pooled(self, handle: Any, bags: Sequence[Bags], grads: Sequence[torch.Tensor]) -> None:
        for store, h, b, g in zip(self.stores, handle, self._split(bags), self._split(grads), strict=True):
            store.backward_pooled(h, b, g)

    def apply_row_grads(
        self,
        rows: Sequence[torch.Tensor],
        grads: Sequence[torch.Tensor],
        row_sq_means: Sequence[torch.Tensor | None] | None = None,
    ) -> None:
        means = self._split(row_sq_means) if row_sq_means is not None else [None] * len(self.stores)
        for store, r, g, m in zip(self.stores, self._split(rows), self._split(grads), means, strict=True):
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


def copy_optimizer_states(current: Sequence[torch.Tensor | None], states: Sequence[torch.Tensor | None]) -> None:
    """Copy optimizer states in place; a None source leaves that block's state as it is."""
    assert len(current) == len(states), (len(current), len(states))
    with torch.no_grad():
        for dst, src in zip(current, states, strict=True):
            if dst is not None and src is not None:
                assert dst.shape == src.shape, (tuple(dst.shape), tuple(src.shape))
                dst.copy_(src)


def make_store(
    kernel: str, shapes: Sequence[tuple[int, int]], optimizer: SparseOptimizer, *, batch_blocks: bool = True
) -> ShardStore:
    """A store of ``kernel``: ``"fbgemm"``, ``"torch"`` or ``"auto"``.

    ``"auto"`` picks fbgemm when its CPU kernels run here and every block width is a
    multiple of 4 (fbgemm's requirement), the torch path otherwise. ``batch_blocks``
    False gives every block its own fbgemm kernel (no padding to a common bag count).
    """
    if kernel not in ("auto", "fbgemm", "torch"):
        raise ConfigError(f"kernel must be 'auto', 'fbgemm' or 'torch', got {kernel!r}")
    odd = [w for _, w in shapes if w % 4]
    if kernel == "fbgemm" and odd:
        raise ConfigError(
            f"fbgemm's table-batched kernels need block widths that are multiples of 4, got {odd}; "
            "use fewer column shards or kernel='auto'/'torch'"
        )
    from lightning_embark.engine.tbe import FbgemmStore, fbgemm_available

    if kernel == "fbgemm" or (kernel == "auto" and not odd and fbgemm_available()):
        if batch_blocks or len(shapes) < 2:
            return FbgemmStore(shapes, optimizer)
        return GroupedStore([FbgemmStore([shape], optimizer) for shape in shapes], [[i] for i in range(len(shapes))])
    return TorchStore(shapes, optimizer)
