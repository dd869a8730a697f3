"""fbgemm's table-batched embedding kernels (TBE) as a :class:`ShardStore`.

On CPU, fbgemm-gpu-cpu 1.8.0 runs ``SplitTableBatchedEmbeddingBagsCodegen`` with
``EmbeddingLocation.HOST`` / ``ComputeDevice.CPU`` and the fused optimizers
``EXACT_SGD``, ``EXACT_ADAGRAD`` and ``EXACT_ROWWISE_ADAGRAD`` (their formulas equal
:class:`TorchStore`'s to fp32 rounding); ``SGD`` and ``ROWWISE_ADAGRAD`` are rejected
as deprecated. Its limits shape this store: widths must be multiples of 4, every
feature shares one batch size, and on CPU the row-wise Adagrad backward fails when
two features share a table, so each block is its own table read by one feature.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch

from lightning_embark.engine._optimizer import OptimizerKind, SparseOptimizer
from lightning_embark.engine.stores._base import Bags, ShardStore, copy_optimizer_states


class FbgemmStore(ShardStore):
    """fbgemm ``SplitTableBatchedEmbeddingBagsCodegen`` on the host with a fused optimizer.

    One kernel table per block, one feature per table (shared tables trip the CPU
    row-wise Adagrad kernel), every block padded to the same bag count because the
    kernel takes one batch size for all features; padding bags are empty.
    """

    def __init__(self, shapes: Sequence[tuple[int, int]], optimizer: SparseOptimizer) -> None:
        super().__init__(shapes, optimizer)
        from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
        from fbgemm_gpu.split_table_batched_embeddings_ops_common import (
            EmbeddingLocation,
            PoolingMode,
        )
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
            ComputeDevice,
            SplitTableBatchedEmbeddingBagsCodegen,
        )

        kinds = {
            OptimizerKind.SGD: EmbOptimType.EXACT_SGD,
            OptimizerKind.ADAGRAD: EmbOptimType.EXACT_ADAGRAD,
            OptimizerKind.ROWWISE_ADAGRAD: EmbOptimType.EXACT_ROWWISE_ADAGRAD,
        }
        self._tbe = None
        if self.shapes:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self._tbe = SplitTableBatchedEmbeddingBagsCodegen(
                    embedding_specs=[
                        (r, w, EmbeddingLocation.HOST, ComputeDevice.CPU) for r, w in self.shapes
                    ],
                    optimizer=kinds[optimizer.kind],
                    learning_rate=optimizer.lr,
                    eps=optimizer.eps,
                    pooling_mode=PoolingMode.SUM,
                    weights_precision=SparseType.FP32,
                )
        self._col_starts = [0]
        for _, w in self.shapes:
            self._col_starts.append(self._col_starts[-1] + w)

    def _run(self, bags: Sequence[Bags], *, grad: bool) -> torch.Tensor:
        """One kernel call over every block, each padded to the largest bag count."""
        assert self._tbe is not None
        batch = max(1, max(b.num_bags for b in bags))
        weighted = any(b.weights is not None for b in bags)
        offsets, indices, weights = [], [], []
        base = 0
        for b in bags:
            offs = b.offsets.to(torch.int64) + base
            offsets += [offs[:-1], offs[-1:].expand(batch - b.num_bags)]
            indices.append(b.indices.to(torch.int64))
            base = int(offs[-1])
            if weighted:
                weights.append(
                    b.weights.float() if b.weights is not None else torch.ones(b.indices.numel())
                )
        offsets.append(torch.tensor([base], dtype=torch.int64))
        psw = torch.cat(weights) if weighted else None
        with torch.set_grad_enabled(grad):
            return self._tbe(torch.cat(indices), torch.cat(offsets), per_sample_weights=psw)

    def pooled(
        self, bags: Sequence[Bags], *, keep_for_backward: bool
    ) -> tuple[list[torch.Tensor], Any]:
        if not bags:
            return [], None
        out = self._run(bags, grad=keep_for_backward)
        pieces = [
            out[: b.num_bags, self._col_starts[i] : self._col_starts[i + 1]].detach()
            for i, b in enumerate(bags)
        ]
        return pieces, (out if keep_for_backward else None)

    def backward_pooled(
        self, handle: Any, bags: Sequence[Bags], grads: Sequence[torch.Tensor]
    ) -> None:
        if handle is None:
            return
        full = torch.zeros_like(handle)
        for i, g in enumerate(grads):
            full[: g.shape[0], self._col_starts[i] : self._col_starts[i + 1]] = g
        torch.autograd.backward(handle, full)

    def apply_row_grads(
        self,
        rows: Sequence[torch.Tensor],
        grads: Sequence[torch.Tensor],
        row_sq_means: Sequence[torch.Tensor | None] | None = None,
    ) -> None:
        if self._tbe is None or all(r.numel() == 0 for r in rows):
            return
        if row_sq_means is not None:
            # The kernel adds the block's own mean(g**2); pre-add the difference so the
            # state ends at s + row_sq_mean (the state tensors are views into the kernel's).
            states = self._tbe.split_optimizer_states()
            for b, (r, g, m) in enumerate(zip(rows, grads, row_sq_means, strict=True)):
                if m is not None and r.numel():
                    states[b][0][r] += m - (g * g).mean(1)
        bags = [Bags(indices=r, offsets=torch.arange(r.numel() + 1)) for r in rows]
        out = self._run(bags, grad=True)
        self.backward_pooled(out, bags, grads)

    def weights(self) -> list[torch.Tensor]:
        return (
            [w.detach() for w in self._tbe.split_embedding_weights()]
            if self._tbe is not None
            else []
        )

    def load(self, weights: Sequence[torch.Tensor]) -> None:
        with torch.no_grad():
            for w, src in zip(self.weights(), weights, strict=True):
                w.copy_(src)

    def optimizer_state(self) -> list[torch.Tensor | None]:
        """The kernel's momentum per block (views into its buffers); None for SGD."""
        if self._tbe is None:
            return []
        states = self._tbe.split_optimizer_states()
        if not states:  # EXACT_SGD keeps no state
            return [None] * len(self.shapes)
        return [s[0].detach() for s in states]

    def load_optimizer_state(self, states: Sequence[torch.Tensor | None]) -> None:
        copy_optimizer_states(self.optimizer_state(), states)


_FBGEMM_OK: bool | None = None


def fbgemm_available() -> bool:
    """Whether fbgemm's CPU table-batched kernels import and run here."""
    global _FBGEMM_OK
    if _FBGEMM_OK is None:
        try:
            store = FbgemmStore([(2, 4)], SparseOptimizer(kind=OptimizerKind.ROWWISE_ADAGRAD))
            store.pooled(
                [Bags(indices=torch.tensor([1]), offsets=torch.tensor([0, 1]))],
                keep_for_backward=False,
            )
            _FBGEMM_OK = True
        except Exception:
            _FBGEMM_OK = False
    return _FBGEMM_OK
