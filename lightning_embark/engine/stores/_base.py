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

Implementations: :class:`~.fbgemm_store.FbgemmStore` (fbgemm's table-batched
kernels), :class:`~.torch_store.TorchStore` (``embedding_bag`` plus an explicit
update; the fallback) and :class:`~.torch_store.GroupedStore` (several stores
behind one).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from lightning_embark.engine._optimizer import SparseOptimizer


@dataclass(frozen=True, kw_only=True)
class Bags:
    """Bags of local row indices for one block: ``offsets`` has ``num_bags + 1`` entries.

    Indices, offsets and weights live on the store's device.
    """

    indices: torch.Tensor
    offsets: torch.Tensor
    weights: torch.Tensor | None = None

    @property
    def num_bags(self) -> int:
        return self.offsets.numel() - 1


@dataclass(frozen=True, kw_only=True)
class FlatBags:
    """Bags of several blocks in the layout of fbgemm's table-batched kernels.

    Block ``t``'s bags are bags ``[t * batch, t * batch + num_bags[t])`` of ``offsets``
    (``[len(num_bags) * batch + 1]`` int64, into ``indices``); the rest of its ``batch``
    bags are empty padding. ``id_counts`` (when the caller knows them on the host) are the
    blocks' IDs, which bound each block's run of ``indices``.
    """

    indices: torch.Tensor
    offsets: torch.Tensor
    weights: torch.Tensor | None
    num_bags: tuple[int, ...]
    batch: int
    id_counts: tuple[int, ...] | None = None

    def block(self, t: int) -> Bags:
        """Block ``t``'s bags alone, for the paths that treat blocks one by one (its bounds
        from :attr:`id_counts`, else copied to the host)."""
        first = t * self.batch
        offsets = self.offsets[first : first + self.num_bags[t] + 1]
        if self.id_counts is not None:
            lo = sum(self.id_counts[:t])
            hi = lo + self.id_counts[t]
        elif offsets.numel():
            lo, hi = (int(x) for x in offsets[[0, -1]].tolist())
        else:
            lo, hi = 0, 0
        return Bags(
            indices=self.indices[lo:hi],
            offsets=offsets - lo,
            weights=self.weights[lo:hi] if self.weights is not None else None,
        )

    def blocks(self) -> list[Bags]:
        return [self.block(t) for t in range(len(self.num_bags))]


def row_grads(bags: Bags, pooled_grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Unique rows of ``bags`` and their summed gradient, given the bags' pooled gradient
    (on the bags' device)."""
    lengths = bags.offsets[1:] - bags.offsets[:-1]
    bag_of = torch.repeat_interleave(
        torch.arange(bags.num_bags, device=bags.offsets.device),
        lengths,
        output_size=bags.indices.numel(),
    )
    contrib = pooled_grad[bag_of]
    if bags.weights is not None:
        contrib = contrib * bags.weights.unsqueeze(1)
    rows, inverse = torch.unique(bags.indices, return_inverse=True)
    summed = pooled_grad.new_zeros(rows.numel(), pooled_grad.shape[1])
    return rows, summed.index_add_(0, inverse, contrib)


def padded_row_grads(
    bags: Bags, pooled_grad: torch.Tensor, *, pad_row: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`row_grads` at a static size, with no host read: ``n`` = the bags' ID count
    rows, the unique ones first (sorted, each with its summed gradient), then ``pad_row``
    with a zero gradient.

    A sort puts equal IDs side by side; ``first`` flags each value's first place and
    ``slot = cumsum(first) - 1`` is the value's rank among the distinct IDs, which is
    ``torch.unique``'s inverse; so the sums (``index_add_`` in ID order) are
    :func:`row_grads`' to the bit, without ``unique`` reading its output size.
    """
    ids = bags.indices.to(torch.int64)
    n = ids.numel()
    lengths = bags.offsets[1:] - bags.offsets[:-1]
    bag_of = torch.repeat_interleave(
        torch.arange(bags.num_bags, device=bags.offsets.device), lengths, output_size=n
    )
    contrib = pooled_grad[bag_of]
    if bags.weights is not None:
        contrib = contrib * bags.weights.unsqueeze(1)
    values, order = torch.sort(ids)
    first = torch.ones_like(values, dtype=torch.bool)
    first[1:] = values[1:] != values[:-1]
    slot = torch.cumsum(first, 0) - 1
    inverse = torch.empty_like(slot)
    inverse[order] = slot
    rows = torch.full_like(values, pad_row).scatter_(0, slot, values)
    summed = pooled_grad.new_zeros(n, pooled_grad.shape[1])
    return rows, summed.index_add_(0, inverse, contrib)


class ShardStore(ABC):
    """The blocks one rank owns for one cluster (a tiny plug point: two kernels)."""

    def __init__(self, shapes: Sequence[tuple[int, int]], optimizer: SparseOptimizer) -> None:
        self.shapes = [(int(r), int(w)) for r, w in shapes]
        self.optimizer = optimizer

    @abstractmethod
    def pooled(
        self, bags: Sequence[Bags], *, keep_for_backward: bool
    ) -> tuple[list[torch.Tensor], Any]:
        """Sum-pool each block's bags; returns ``[num_bags, width]`` per block and a handle."""

    def backward_pooled(
        self, handle: Any, bags: Sequence[Bags], grads: Sequence[torch.Tensor]
    ) -> None:
        """Apply the optimizer for the pooled gradients of a :meth:`pooled` call."""
        rows, summed = (
            zip(*(row_grads(b, g) for b, g in zip(bags, grads, strict=True)), strict=False)
            if bags
            else ((), ())
        )
        self.apply_row_grads(list(rows), list(summed))

    def pooled_flat(self, bags: FlatBags, *, keep_for_backward: bool) -> tuple[torch.Tensor, Any]:
        """Sum-pool every block's bags at once: ``[bags.batch, sum(widths)]``, block ``t``'s
        pooled bags in rows ``[0, num_bags[t])`` of its columns (zeros below), and a handle
        for :meth:`backward_flat`. Block by block here; a table-batched kernel does it in
        one call."""
        blocks = bags.blocks()
        pieces, handle = self.pooled(blocks, keep_for_backward=keep_for_backward)
        out = torch.zeros(bags.batch, sum(w for _, w in self.shapes), device=self.device_of(bags))
        start = 0
        for piece, (_, width) in zip(pieces, self.shapes, strict=True):
            out[: piece.shape[0], start : start + width] = piece
            start += width
        return out, (handle, blocks)

    def backward_flat(self, handle: Any, bags: FlatBags, grad: torch.Tensor) -> None:
        """Apply the optimizer for the pooled gradient ``grad`` (shaped like
        :meth:`pooled_flat`'s output) of a :meth:`pooled_flat` call."""
        inner, blocks = handle
        grads, start = [], 0
        for n, (_, width) in zip(bags.num_bags, self.shapes, strict=True):
            grads.append(grad[:n, start : start + width])
            start += width
        self.backward_pooled(inner, blocks, grads)

    def apply_flat(self, bags: FlatBags, grad: torch.Tensor) -> None:
        """Apply the optimizer to the rows of ``bags`` (one row per bag) with the gradient
        ``grad`` (shaped like :meth:`pooled_flat`'s output): rows asked for several times
        add their gradients first."""
        _, handle = self.pooled_flat(bags, keep_for_backward=True)
        self.backward_flat(handle, bags, grad)

    def gather(self, blocks: torch.Tensor, ids: torch.Tensor) -> torch.Tensor | None:
        """Row ``ids[i]`` of block ``blocks[i]`` for every ``i``, ``[n, width]``, where the
        store can read its rows directly (every block one width); None otherwise (look the
        rows up as bags of one)."""
        return None

    @staticmethod
    def device_of(bags: FlatBags) -> torch.device:
        return bags.offsets.device

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


def copy_optimizer_states(
    current: Sequence[torch.Tensor | None], states: Sequence[torch.Tensor | None]
) -> None:
    """Copy optimizer states in place; a None source leaves that block's state as it is."""
    assert len(current) == len(states), (len(current), len(states))
    with torch.no_grad():
        for dst, src in zip(current, states, strict=True):
            if dst is not None and src is not None:
                assert dst.shape == src.shape, (tuple(dst.shape), tuple(src.shape))
                dst.copy_(src)
