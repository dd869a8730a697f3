"""Owner-side stores: fbgemm's CPU kernels agree with the torch path for every optimizer."""

from __future__ import annotations

import pytest
import torch

from lightning_embark.accounting import DispatchCounter
from lightning_embark.engine._optimizer import OptimizerKind, SparseOptimizer
from lightning_embark.engine.stores import Bags, GroupedStore, TorchStore, make_store, row_grads
from lightning_embark.engine.stores._base import padded_row_grads
from lightning_embark.engine.stores._fbgemm_store import FbgemmStore, fbgemm_available
from lightning_embark.errors import ConfigError

SHAPES = [(10, 8), (7, 4), (5, 12)]


def _bags(step: int) -> list[Bags]:
    g = torch.Generator().manual_seed(step)
    return [
        Bags(
            indices=torch.tensor([1, 2, 2, 9, 0]),
            offsets=torch.tensor([0, 3, 3, 5]),
            weights=torch.rand(5, generator=g),
        ),
        Bags(
            indices=torch.zeros(0, dtype=torch.int64),
            offsets=torch.tensor([0, 0]),
            weights=torch.zeros(0),
        ),
        Bags(
            indices=torch.tensor([4, 4, 3]),
            offsets=torch.tensor([0, 1, 2, 3, 3, 3]),
            weights=torch.ones(3),
        ),
    ]


@pytest.mark.skipif(not fbgemm_available(), reason="fbgemm CPU kernels unavailable")
@pytest.mark.parametrize("kind", list(OptimizerKind))
def test_fbgemm_exact_optimizers_match_the_torch_path(kind: OptimizerKind) -> None:
    """Gradients and bag weights are drawn from continuous distributions, so no row's
    gradient cancels to a rounding residue (a row without IDs gets exactly zero on both
    sides); Adagrad's ``g / (sqrt(G) + eps)`` then stays well conditioned and the two
    kernels differ only by fp32 summation order over <= 3 terms per step for 3 steps,
    a few ulp of O(1) values. rtol 1e-5 (~80 ulp) and atol 1e-6 leave a wide margin."""
    optimizer = SparseOptimizer(kind=kind, lr=0.3, eps=1e-6)
    init = [
        torch.randn(*s, generator=torch.Generator().manual_seed(i)) for i, s in enumerate(SHAPES)
    ]
    stores = [
        FbgemmStore(SHAPES, optimizer),
        TorchStore(SHAPES, optimizer),
        make_store("fbgemm", SHAPES, optimizer, batch_blocks=False),
    ]
    assert isinstance(stores[2], GroupedStore)
    for store in stores:
        store.load(init)
    for step in range(3):
        bags = _bags(step)
        grads = [
            torch.randn(b.num_bags, w, generator=torch.Generator().manual_seed(10 + step))
            for b, (_, w) in zip(bags, SHAPES, strict=False)
        ]
        rows = [torch.tensor([3, 6]), torch.tensor([0]), torch.tensor([1, 2, 4])]
        updates = [torch.randn(r.numel(), w) for r, (_, w) in zip(rows, SHAPES, strict=False)]
        means = (
            [torch.rand(r.numel()) for r in rows]
            if kind is OptimizerKind.ROWWISE_ADAGRAD
            else None
        )
        pooled = []
        for store in stores:
            out, handle = store.pooled(bags, keep_for_backward=True)
            pooled.append(out)
            store.backward_pooled(handle, bags, grads)
            store.apply_row_grads(rows, updates, means)
        for out in pooled[1:]:
            for a, b in zip(out, pooled[0], strict=False):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    for store in stores[1:]:
        for a, b in zip(store.weights(), stores[0].weights(), strict=False):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_row_grads_sum_duplicates_with_weights() -> None:
    bags = Bags(
        indices=torch.tensor([2, 0, 2, 1]),
        offsets=torch.tensor([0, 3, 4]),
        weights=torch.tensor([1.0, 2, 3, 4]),
    )
    rows, summed = row_grads(bags, torch.tensor([[1.0], [10.0]]))
    assert rows.tolist() == [0, 1, 2]
    assert summed.flatten().tolist() == [2.0, 40.0, 4.0]


def test_padded_row_grads_are_row_grads_to_the_bit_then_padding() -> None:
    """The static-size path sums the same terms in the same order (``index_add_`` over the
    IDs in bag order, its inverse equal to ``torch.unique``'s), so it equals
    :func:`row_grads` exactly; the rest is the pad row with a zero gradient, and nothing
    would sync a GPU."""
    g = torch.Generator().manual_seed(3)
    for bags in _bags(0):
        grad = torch.randn(bags.num_bags, 8, generator=g)
        rows, summed = row_grads(bags, grad)
        counter = DispatchCounter()
        with counter.counting():
            padded_rows, padded = padded_row_grads(bags, grad, pad_row=99)
        assert counter.snapshot().device_syncs == 0, counter.snapshot().syncs
        n = rows.numel()
        assert padded_rows.numel() == bags.indices.numel()
        assert torch.equal(padded_rows[:n], rows) and torch.equal(padded[:n], summed)
        assert (padded_rows[n:] == 99).all() and (padded[n:] == 0).all()


@pytest.mark.parametrize("kind", list(OptimizerKind))
def test_the_torch_stores_pooled_update_leaves_its_scratch_row_out(kind: OptimizerKind) -> None:
    """The pooled update (padded rows landing on each block's scratch row) and the explicit
    one (unique rows) give the same weights and states bit for bit, and the stores' tensors
    keep their shapes."""
    optimizer = SparseOptimizer(kind=kind, lr=0.3, eps=1e-6)
    pooled, explicit = TorchStore(SHAPES, optimizer), TorchStore(SHAPES, optimizer)
    init = [
        torch.randn(*s, generator=torch.Generator().manual_seed(i)) for i, s in enumerate(SHAPES)
    ]
    pooled.load(init)
    explicit.load(init)
    for step in range(3):
        bags = _bags(step)
        g = torch.Generator().manual_seed(10 + step)
        grads = [
            torch.randn(b.num_bags, w, generator=g) for b, (_, w) in zip(bags, SHAPES, strict=True)
        ]
        pooled.backward_pooled(None, bags, grads)
        rows, summed = zip(
            *(row_grads(b, gr) for b, gr in zip(bags, grads, strict=True)), strict=True
        )
        explicit.apply_row_grads(list(rows), list(summed))
    for a, b, (r, w) in zip(pooled.weights(), explicit.weights(), SHAPES, strict=True):
        assert a.shape == (r, w) and torch.equal(a, b)
    for a, b in zip(pooled.optimizer_state(), explicit.optimizer_state(), strict=True):
        assert (a is None and b is None) or torch.equal(a, b)


def test_store_choice_and_errors() -> None:
    assert isinstance(make_store("torch", SHAPES, SparseOptimizer()), TorchStore)
    assert isinstance(
        make_store("auto", [(4, 6)], SparseOptimizer()), TorchStore
    )  # width 6: not fbgemm's
    with pytest.raises(ConfigError, match="store must be"):
        make_store("cuda", SHAPES, SparseOptimizer())
    with pytest.raises(ConfigError, match="lr must be > 0"):
        SparseOptimizer(lr=0)
