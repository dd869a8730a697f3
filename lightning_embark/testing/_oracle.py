"""The unsharded oracle: the sparse optimizer applied to a plain torchrec collection.

Exactness tests and benchmarks compare the sharded module against one unsharded
``EmbeddingBagCollection`` fed the global batch; this module applies the same
:class:`SparseOptimizer` update to it from its dense weight gradients (rows with a
zero gradient are unchanged by every supported optimizer, so dense and sparse
updates agree).
"""

from __future__ import annotations

import torch
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from lightning_embark.engine import OptimizerKind, SparseOptimizer


class ReferenceOptimizer:
    """Applies ``optimizer`` to every table of ``ebc`` from ``weight.grad``."""

    def __init__(self, ebc: EmbeddingBagCollection, optimizer: SparseOptimizer) -> None:
        self.ebc = ebc
        self.optimizer = optimizer
        self.state: dict[str, torch.Tensor] = {}
        for name, bag in ebc.embedding_bags.items():
            if optimizer.kind is OptimizerKind.ADAGRAD:
                self.state[name] = torch.zeros_like(bag.weight)
            elif optimizer.kind is OptimizerKind.ROWWISE_ADAGRAD:
                self.state[name] = torch.zeros(bag.weight.shape[0])

    @torch.no_grad()
    def step(self) -> None:
        lr, eps = self.optimizer.lr, self.optimizer.eps
        for name, bag in self.ebc.embedding_bags.items():
            w, g = bag.weight, bag.weight.grad
            if g is None:
                continue
            if self.optimizer.kind is OptimizerKind.SGD:
                w -= lr * g
            elif self.optimizer.kind is OptimizerKind.ADAGRAD:
                self.state[name] += g * g
                w -= lr * g / (self.state[name].sqrt() + eps)
            else:
                self.state[name] += (g * g).mean(1)
                w -= lr * g / (self.state[name].sqrt() + eps).unsqueeze(1)
            bag.weight.grad = None
