"""The differentiable compressed exchange: exact in fp32, within the codecs' bounds
compressed, and across gloo ranks over flat and hierarchical all-to-alls."""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist

from lightning_embark.errors import ConfigError
from lightning_embark.exchange import FlatAllToAll, HierarchicalAllToAll, exchange, loopback, over
from lightning_embark.kernels import ExchangeLayout, RankSlice
from lightning_embark.testing import run_gloo_ranks
from lightning_embark.wire._codecs import BF16, FP8_E4M3, FP8_E5M2, FP32, INT8, Codec

# Two owners send row-shard partials of the same [3, 8] block: y = x[:3] + x[3:].
SEND = ExchangeLayout.from_row_splits([3, 3], [(0, 5), (5, 3)], num_cols=8)
RECV = ExchangeLayout(
    ranks=(RankSlice(row_start=0, row_stop=3, blocks=((0, 5), (5, 3))),) * 2,
    num_rows=3,
    num_cols=8,
)


def test_exchange_fp32_is_exact_both_ways(triton_cpu: str) -> None:
    x = torch.randn(6, 8, requires_grad=True)
    y = exchange(
        x, send=SEND, recv=RECV, forward_codec=FP32, backward_codec=FP32, backend=triton_cpu
    )
    assert torch.equal(y, x[:3] + x[3:])
    grad = torch.randn(3, 8)
    y.backward(grad)
    assert torch.equal(x.grad, torch.cat([grad, grad]))  # a sum's gradient goes to every shard


@pytest.mark.parametrize(
    ("forward", "backward", "backend"),
    [(FP8_E4M3, FP8_E5M2, "triton"), (INT8, INT8, "reference"), (BF16, BF16, "reference")],
    ids=["fp8", "int8", "bf16"],
)
def test_exchange_compressed_within_bounds(
    forward: Codec, backward: Codec, backend: str, request
) -> None:
    if backend == "triton":
        request.getfixturevalue("triton_cpu")
    x = (torch.randn(6, 8) * 3).requires_grad_()
    counter = torch.zeros((), dtype=torch.int64)
    y = exchange(
        x,
        send=SEND,
        recv=RECV,
        forward_codec=forward,
        backward_codec=backward,
        backend=backend,
        nonfinite=counter,
    )
    v = x.detach()
    limit = forward.bound.limit
    error_bound = torch.cat(
        [limit(v[:3, :5]) + limit(v[3:, :5]), limit(v[:3, 5:]) + limit(v[3:, 5:])], dim=1
    )
    assert torch.all((y.detach() - (v[:3] + v[3:])).abs() <= error_bound)
    grad = torch.randn(3, 8)
    grad[0, 0] = math.inf
    y.backward(grad)
    clean = grad.clone()
    clean[0, 0] = 0.0
    limit = torch.cat(
        [backward.bound.limit(clean[:, :5]), backward.bound.limit(clean[:, 5:])], dim=1
    )
    assert torch.isfinite(x.grad).all()
    finite = torch.ones(3, 8, dtype=torch.bool)
    finite[0, 0] = False  # the inf itself saturates; its neighbours keep their bound
    assert torch.all(
        ((x.grad - torch.cat([clean, clean])).abs() <= torch.cat([limit, limit]))[
            torch.cat([finite, finite])
        ]
    )
    assert int(counter) == 2  # the inf, packed once per contributing owner


def test_loopback_rejects_multi_rank_splits() -> None:
    with pytest.raises(ConfigError, match="equal send and receive splits"):
        loopback(torch.zeros(4, dtype=torch.uint8), [4, 0], [0, 4])


def _rows_to_owners(rank: int, world: int, hierarchical: bool) -> None:
    """Every rank sends rank ``p`` its rows ``[2p, 2p + 2)`` of a ``[2W, 4]`` block (a
    tower's output going back to the samples' ranks); the gradient comes back the same way."""
    exchange_ = HierarchicalAllToAll(2) if hierarchical else FlatAllToAll()
    send = ExchangeLayout(
        ranks=tuple(
            RankSlice(row_start=2 * p, row_stop=2 * p + 2, blocks=((0, 4),)) for p in range(world)
        ),
        num_rows=2 * world,
        num_cols=4,
    )
    recv = ExchangeLayout(
        ranks=tuple(
            RankSlice(row_start=2 * q, row_stop=2 * q + 2, blocks=((0, 4),)) for q in range(world)
        ),
        num_rows=2 * world,
        num_cols=4,
    )
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(2 * world, 4, generator=g).requires_grad_()
    y = exchange(
        x, send=send, recv=recv, forward_codec=FP32, backward_codec=FP32, transport=over(exchange_)
    )
    everyone = [torch.zeros(2 * world, 4) for _ in range(world)]
    dist.all_gather(everyone, x.detach())
    # Row block q of y is source q's rows [2 * rank, 2 * rank + 2).
    assert torch.equal(
        y.detach(), torch.cat([everyone[q][2 * rank : 2 * rank + 2] for q in range(world)])
    )
    grad = torch.randn(2 * world, 4, generator=g)
    y.backward(grad)
    grads = [torch.zeros(2 * world, 4) for _ in range(world)]
    dist.all_gather(grads, grad)
    # x's rows [2p, 2p + 2) went to rank p as its block ``rank``: their gradient is p's.
    assert torch.equal(
        x.grad, torch.cat([grads[p][2 * rank : 2 * rank + 2] for p in range(world)])
    )


@pytest.mark.multiprocess
@pytest.mark.parametrize("hierarchical", [False, True], ids=["flat", "hierarchical"])
def test_exchange_across_ranks_is_exact_both_ways(hierarchical: bool) -> None:
    run_gloo_ranks(_rows_to_owners, 4, hierarchical)
