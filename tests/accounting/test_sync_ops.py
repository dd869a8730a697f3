"""Which ops would make the host wait for a CUDA device: each listed op is flagged with its
reason, and the ops that only look data-dependent (sorts, scans, integer indexing, a
``repeat_interleave`` given its output size) are not."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from lightning_embark.accounting import DispatchCounter
from lightning_embark.accounting._sync_ops import COALESCE, SCALAR, SHAPE


def _flagged(fn: Callable[[], object]) -> list[tuple[str, str]]:
    counter = DispatchCounter()
    with counter.counting():
        fn()
    return sorted((s.op, s.reason) for s in counter.snapshot().syncs)


x = torch.tensor([3, 1, 2, 3, 0])
mask = x > 1


@pytest.mark.parametrize(
    ("fn", "expected"),
    [
        (lambda: x.sum().item(), [("aten._local_scalar_dense.default", SCALAR)]),
        (lambda: int(x[0]), [("aten._local_scalar_dense.default", SCALAR)]),
        (lambda: bool((x > 0).all()), [("aten._local_scalar_dense.default", SCALAR)]),
        (lambda: torch.equal(x, x), [("aten.equal.default", SCALAR)]),
        (lambda: x.nonzero(), [("aten.nonzero.default", SHAPE)]),
        (lambda: x.masked_select(mask), [("aten.masked_select.default", SHAPE)]),
        (lambda: x[mask], [("aten.index.Tensor", SHAPE)]),
        (lambda: torch.unique(x), [("aten._unique2.default", SHAPE)]),
        (lambda: torch.unique_consecutive(x), [("aten.unique_consecutive.default", SHAPE)]),
        (lambda: torch.bincount(x), [("aten.bincount.default", SHAPE)]),
        (lambda: torch.repeat_interleave(x), [("aten.repeat_interleave.Tensor", SHAPE)]),
        (
            lambda: x.clone().index_put_((mask,), torch.tensor(0)),
            [("aten.index_put_.default", SHAPE)],
        ),
        (lambda: torch.histc(x.float(), bins=4), [("aten.histc.default", SHAPE)]),
        (
            lambda: torch.sparse.mm(
                torch.sparse_coo_tensor(
                    torch.tensor([[0, 0], [1, 1]]), torch.ones(2), (2, 2), check_invariants=False
                ),
                torch.ones(2, 3),
            ),
            [("aten._sparse_addmm.default", COALESCE)],
        ),
    ],
)
def test_a_syncing_op_is_flagged_with_its_reason(
    fn: Callable[[], object], expected: list[tuple[str, str]]
) -> None:
    assert _flagged(fn) == expected


@pytest.mark.parametrize(
    "fn",
    [
        lambda: torch.sort(x),
        lambda: torch.cumsum(x, 0),
        lambda: torch.aminmax(x),
        lambda: x[torch.tensor([0, 2])],
        lambda: x.index_select(0, torch.tensor([1])),
        lambda: x.clone().index_put_((torch.tensor([1]),), torch.tensor(0)),
        lambda: torch.repeat_interleave(torch.arange(3), torch.tensor([1, 2, 0]), output_size=3),
        lambda: torch.histc(x.float(), bins=4, min=0, max=3),
        lambda: torch.sparse.mm(
            torch.sparse_coo_tensor(
                torch.tensor([[0], [1]]), torch.ones(1), (2, 2), check_invariants=False
            ).coalesce(),
            torch.ones(2, 3),
        ),
        lambda: x.nonzero_static(size=5),
    ],
)
def test_an_op_the_device_computes_alone_is_not_flagged(fn: Callable[[], object]) -> None:
    assert _flagged(fn) == []
