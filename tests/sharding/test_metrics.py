"""The metrics callback times the engine's own backward node, also under a tower
collection's concatenated output."""

from __future__ import annotations

from typing import Any

import torch

from lightning_embark.sharding._metrics import _engine_node


class _Lookup(torch.autograd.Function):
    """Stands in for the engine's lookup node (same name, so the same backward name)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad * 2


def test_the_engine_node_is_found_under_splits_and_a_concatenation() -> None:
    pooled = _Lookup.apply(torch.ones(4, 6, requires_grad=True))
    a, b = pooled.split([2, 4], dim=1)
    out = torch.cat([b, a], dim=1)  # what ShardedEmbeddingTowerCollection returns
    assert out.grad_fn.name() != "_LookupBackward"
    assert _engine_node(out.grad_fn).name() == "_LookupBackward"
    assert _engine_node(pooled.grad_fn) is pooled.grad_fn
    plain = torch.ones(2, requires_grad=True) * 3  # no engine node: the node itself
    assert _engine_node(plain.grad_fn) is plain.grad_fn
