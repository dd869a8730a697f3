"""How far a sharded fp32 result may lie from the unsharded oracle, from the arithmetic.

The sharded module and the oracle add the same terms in different orders (each rank
sums its own samples, then the ranks' partial sums are added; the oracle sums the
global batch at once). For ``n`` terms ``c_i`` every summation order lies within
``gamma(n - 1) * sum(|c_i|)`` of the exact sum, with ``gamma(k) = k u / (1 - k u)``
and ``u = 2**-24`` (Higham, *Accuracy and Stability of Numerical Algorithms*, 4.2), so
two orders differ by at most twice that (:func:`summation_bound`).

A sparse optimizer turns a gradient difference ``dg`` into a weight difference of at
most ``sensitivity * dg`` per step (:func:`update_sensitivity`): SGD's update
``lr * g`` has slope ``lr``; Adagrad's ``lr * g / (sqrt(s + g**2) + eps)`` and the
row-wise variant's have slope at most ``lr / eps``, reached where ``s`` and ``g`` are
near 0. That last case is why exactness tests of Adagrad train with an ``eps`` near
``lr``: with MLPerf's ``eps = 1e-8`` a gradient that cancels down to ~``eps`` turns an
fp32 rounding of its terms into an update difference ``5e6`` times larger, and which
weights that hits depends on the CPU's summation kernels.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from lightning_embark.engine import OptimizerKind, SparseOptimizer, jagged_by_key

#: Unit roundoff of fp32.
U = 2.0**-24


def gamma(k: torch.Tensor | float) -> torch.Tensor:
    """``k u / (1 - k u)``: the relative error bound of a sum of ``k + 1`` terms."""
    k = torch.as_tensor(k, dtype=torch.float64).clamp_min(0)
    return k * U / (1 - k * U)


def summation_bound(abs_sum: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """Largest difference of two fp32 sums of the same ``count`` terms whose magnitudes add
    up to ``abs_sum`` (element-wise): ``2 gamma(count - 1) abs_sum``."""
    return 2 * gamma(count.to(torch.float64) - 1) * abs_sum.to(torch.float64)


def update_sensitivity(optimizer: SparseOptimizer) -> float:
    """A bound on ``|d update / d g|`` of the optimizer's step (see the module docstring)."""
    if optimizer.kind is OptimizerKind.SGD:
        return optimizer.lr
    return optimizer.lr / optimizer.eps


def gradient_terms(
    tables: Sequence[EmbeddingBagConfig], batch: KeyedJaggedTensor, upstream: torch.Tensor
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """What the gradient of ``sum(upstream * EBC(batch))`` adds up, per table and element.

    Row ``r``, column ``j`` of a table gets one term per occurrence of ID ``r`` in the
    batch: ``coef * upstream[sample, j]`` with ``coef`` 1 (sum pooling), the sample's
    weight (weighted bags) or ``1 / bag length`` (mean pooling).

    Args:
        tables: The collection's table configs (in collection order).
        batch: The global batch.
        upstream: ``[B, sum of the features' widths]``, features in collection order.

    Returns:
        By torchrec table name: ``sum(|terms|)`` per element ``[rows, dim]`` and the number
        of terms per row ``[rows, 1]``.
    """
    jagged = jagged_by_key(batch)
    out, col = {}, 0
    for config in tables:
        abs_sum = torch.zeros(config.num_embeddings, config.embedding_dim, dtype=torch.float64)
        count = torch.zeros(config.num_embeddings, 1, dtype=torch.float64)
        for feature in config.feature_names:
            values, lengths, weights = jagged[feature]
            bag = torch.repeat_interleave(torch.arange(lengths.numel()), lengths.to(torch.int64))
            coef = torch.ones(values.numel(), dtype=torch.float64)
            if config.pooling == PoolingType.MEAN:
                coef = coef / lengths.to(torch.float64).clamp_min(1)[bag]
            if weights is not None:
                coef = coef * weights.to(torch.float64).abs()
            terms = (
                coef.unsqueeze(1)
                * upstream[bag, col : col + config.embedding_dim].to(torch.float64).abs()
            )
            abs_sum.index_add_(0, values.to(torch.int64), terms)
            count.index_add_(
                0, values.to(torch.int64), torch.ones(values.numel(), 1, dtype=torch.float64)
            )
            col += config.embedding_dim
        out[config.name] = (abs_sum, count)
    return out


#: fp32 operations in one optimizer step of one element, each within ``u`` of the
#: update's magnitude (square, add, sqrt, add eps, divide, scale, subtract; SGD fewer).
STEP_OPERATIONS = 8


def step_bound(
    previous: torch.Tensor,
    optimizer: SparseOptimizer,
    abs_sum: torch.Tensor,
    count: torch.Tensor,
    *,
    term_error: float = 0.0,
) -> torch.Tensor:
    """The weight bound after one more step, to first order.

    The step's gradients differ by at most ``delta = summation_bound(abs_sum, count)``
    plus ``term_error * abs_sum`` when the terms themselves carry a relative error (a
    dense backward upstream). SGD moves a weight by ``lr * delta``. Adagrad depends on
    the element's gradient and on the state grown from it, each with slope at most
    ``s = lr / eps``: ``2 s delta``. Row-wise Adagrad's state is the row's mean square,
    which ties every element to the row: with ``|g_j| <= sqrt(d * mean(g**2))`` the
    row's terms add at most ``s sqrt(d) max_row(delta)`` per path: ``s (delta + 2
    sqrt(d) max_row(delta))``.
    """
    delta = summation_bound(abs_sum, count) + term_error * abs_sum.to(torch.float64)
    slope = update_sensitivity(optimizer)
    if optimizer.kind is OptimizerKind.SGD:
        step = slope * delta
    elif optimizer.kind is OptimizerKind.ADAGRAD:
        step = 2 * slope * delta
    else:
        row_max = delta.amax(dim=1, keepdim=True) if delta.numel() else delta
        step = slope * (delta + 2 * delta.shape[1] ** 0.5 * row_max)
    return previous.to(torch.float64) + step


def rounding_bound(weight: torch.Tensor, moved: torch.Tensor) -> torch.Tensor:
    """The rounding of the update arithmetic itself: :data:`STEP_OPERATIONS` ulps of the
    final weight plus of everything the steps moved it (``moved``: summed ``|step|``)."""
    return STEP_OPERATIONS * U * (weight.abs().to(torch.float64) + moved.to(torch.float64))


def assert_within(
    actual: torch.Tensor, expected: torch.Tensor, bound: torch.Tensor, what: str
) -> None:
    """Every element of ``actual`` within ``bound`` of ``expected``."""
    error = (actual.to(torch.float64) - expected.to(torch.float64)).abs()
    excess = error - bound.to(torch.float64)
    if excess.numel() and float(excess.max()) > 0:
        worst = int(excess.argmax())
        raise AssertionError(
            f"{what}: {int((excess > 0).sum())} of {excess.numel()} elements outside the derived "
            f"bound; worst |diff| {float(error.reshape(-1)[worst]):.3g} > bound "
            f"{float(bound.reshape(-1)[worst]):.3g}"
        )


def pooled_bound(
    tables: Sequence[EmbeddingBagConfig],
    batch: KeyedJaggedTensor,
    weights: dict[str, torch.Tensor],
    weight_bounds: dict[str, torch.Tensor],
) -> torch.Tensor:
    """How far the sharded forward may lie from the oracle's, per output element.

    A pooled value sums ``coef * w`` over its bag: the weights may already differ by
    their bound, and the sum itself is taken in another order (row shards add their
    partial sums), so the bound is ``sum(coef * weight_bound) + 2 gamma(len - 1) *
    sum(|coef * w|)``, in the collection's output layout.
    """
    jagged = jagged_by_key(batch)
    parts = []
    for config in tables:
        mode = "mean" if config.pooling == PoolingType.MEAN else "sum"
        w = weights[config.name].detach().to(torch.float64).abs()
        bound = weight_bounds[config.name].to(torch.float64)
        for feature in config.feature_names:
            values, lengths, sample_weights = jagged[feature]
            offsets = torch.cat(
                [torch.zeros(1, dtype=torch.int64), lengths.to(torch.int64).cumsum(0)]
            )[:-1]
            psw = sample_weights.to(torch.float64).abs() if sample_weights is not None else None
            ids = values.to(torch.int64)
            moved = torch.nn.functional.embedding_bag(
                ids, bound, offsets, mode=mode, per_sample_weights=psw
            )
            magnitude = torch.nn.functional.embedding_bag(
                ids, w, offsets, mode=mode, per_sample_weights=psw
            )
            parts.append(moved + 2 * gamma(lengths.to(torch.float64) - 1).unsqueeze(1) * magnitude)
    return torch.cat(parts, dim=1)
