"""Feature affinity learned by a flat DLRM: which feature pairs the model relies on.

The tower partitioner (:mod:`._partition`) keeps strongly interacting features in one
tower, since a compressing tower module mixes only its own features before they cross
hosts. "Interacting" is read from a short warm-up run of the flat model, as the size of
each feature pair's term where the model's interaction feeds the rest of the network,
measured on real batches (root mean square over samples):

* **Dot interaction** (torchrec ``InteractionArch``): the pair ``(i, j)`` enters the
  top MLP as the scalar ``z_ij = <e_i, e_j>`` through column ``w_ij`` of its first
  layer, so its contribution to that layer's pre-activations has RMS
  ``A_ij = ||w_ij||_2 * sqrt(E[z_ij^2])``.
* **DCN-v2** (torchrec ``InteractionDCNArch`` with ``LowRankCrossNet``): a cross layer
  adds ``x_0 * (W V x_l)``; feature ``j``'s input block reaches feature ``i``'s output
  block through ``W_i V_j`` (the ``d``-row / ``d``-column blocks), multiplied
  element-wise by ``x_0``'s block ``i``. With ``x_l ~ x_0`` and the blocks treated as
  independent, that term has RMS ``sqrt(m_i * E||W_i V_j e_j||^2)`` with ``m_i`` the mean
  square of ``e_i``'s elements, and ``E||W_i V_j e_j||^2 = sum((W_i^T W_i) * (V_j S_j
  V_j^T))`` for the second moment ``S_j = E[e_j e_j^T]`` (``r x r`` products, never the
  ``N x N`` matrix). Summed over layers and symmetrised, ``A_ij = (a_ij + a_ji) / 2``.

Both are first-order measures (they ignore the top MLP's non-linearity); they are this
project's design, DMT's own partitioner is not public. The dense vector's pairs are left
out: it is not a table and is on every rank.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import torch
from torch import nn
from torchrec.models.dlrm import InteractionArch, InteractionDCNArch
from torchrec.modules.crossnet import LowRankCrossNet

from lightning_embark.errors import ConfigError
from lightning_embark.planner._partition import FeatureAffinity


@torch.no_grad()
def measure_affinity(
    dlrm: nn.Module, batches: Iterable[Any], *, max_batches: int = 8, source: str = ""
) -> FeatureAffinity:
    """The affinity of a trained flat torchrec ``DLRM`` / ``DLRM_DCN`` (see the module
    docstring), its moments averaged over up to ``max_batches`` batches.

    Args:
        dlrm: The model (``DLRMModule(...).model``), tables materialised.
        batches: torchrec ``Batch`` es (``dense_features``, ``sparse_features``).
        max_batches: Batches to average over.
        source: What the affinity is measured from, for reports.

    Raises:
        ConfigError: the model has no flat sparse arch or an interaction other than
            the dot product or a low-rank DCN; no batch was given.
    """
    model: Any = dlrm  # torchrec's DLRM types, read by attribute
    for name in ("sparse_arch", "dense_arch", "inter_arch", "over_arch"):
        if not hasattr(model, name):
            raise ConfigError(
                f"affinity is measured on a flat torchrec DLRM / DLRM_DCN; {type(dlrm).__name__} "
                f"has no {name} (measure the flat model, then build the towers)"
            )
    inter = model.inter_arch
    dot = isinstance(inter, InteractionArch)
    if not dot and not (
        isinstance(inter, InteractionDCNArch) and isinstance(inter.crossnet, LowRankCrossNet)
    ):
        raise ConfigError(
            f"affinity knows the dot interaction and the low-rank DCN, not {type(inter).__name__}"
        )
    names = tuple(model.sparse_arch.sparse_feature_names)
    moments: torch.Tensor | None = None
    samples = 0
    for count, batch in enumerate(batches):
        if count >= max_batches:
            break
        emb = model.sparse_arch(batch.sparse_features).double()  # [B, F, d]
        if dot:
            pairs = torch.bmm(emb, emb.transpose(1, 2))
            part = (pairs * pairs).sum(0)  # sum_b z_ij^2
        else:
            part = torch.einsum("bid,bie->ide", emb, emb)  # sum_b e_i e_i^T
        moments = part if moments is None else moments + part
        samples += emb.shape[0]
    if moments is None or samples == 0:
        raise ConfigError(f"affinity ({source or 'measure'}): no batches to measure on")
    moments = moments / samples
    matrix = _dot(model, moments, dim=emb.shape[2]) if dot else _dcn(model, moments)
    return FeatureAffinity(features=names, matrix=matrix, source=source)


def _dot(dlrm: Any, square_dots: torch.Tensor, *, dim: int) -> np.ndarray:
    """``A_ij = ||w_ij|| sqrt(E z_ij^2)`` from ``E z^2`` ``[F, F]``; the top MLP reads
    the dense vector (``dim`` wide) and then the pairs in ``triu_indices`` order."""
    features = square_dots.shape[0]
    first = next(m for m in dlrm.over_arch.modules() if isinstance(m, nn.Linear))
    rows, cols = torch.triu_indices(features + 1, features + 1, offset=1)
    assert first.in_features == dim + len(rows)
    column_norms = first.weight.detach().double()[:, dim:].norm(dim=0)
    weights = torch.zeros(features + 1, features + 1, dtype=torch.float64)
    weights[rows, cols] = column_norms
    weights = (weights + weights.T)[1:, 1:]  # drop the dense vector's pairs
    out = weights * square_dots.clamp(min=0).sqrt()
    out.fill_diagonal_(0.0)
    return out.numpy()


def _dcn(dlrm: Any, second: torch.Tensor) -> np.ndarray:
    """``A`` of a low-rank cross net from each feature's ``S_j`` ``[F, d, d]``."""
    features, dim, _ = second.shape
    net: LowRankCrossNet = dlrm.inter_arch.crossnet
    mean_square = torch.diagonal(second, dim1=1, dim2=2).mean(dim=1)  # m_i
    total = torch.zeros(features, features, dtype=torch.float64)
    for w, v in zip(net.W_kernels, net.V_kernels, strict=True):
        w = w.detach().double()[dim:].reshape(features, dim, -1)  # W_i: [d, r]
        v = v.detach().double()[:, dim:].reshape(-1, features, dim).transpose(0, 1)  # V_j
        gram_w = torch.einsum("idr,ids->irs", w, w)
        spread_v = torch.einsum("jrd,jde,jse->jrs", v, second, v)
        reach = torch.einsum("irs,jrs->ij", gram_w, spread_v).clamp(min=0)
        total += (mean_square[:, None] * reach).sqrt()
    out = 0.5 * (total + total.T)
    out.fill_diagonal_(0.0)
    return out.numpy()
