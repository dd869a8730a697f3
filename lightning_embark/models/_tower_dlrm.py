"""DLRM over towers (DMT): the dense model reads tower outputs as extra sparse features.

With towers, a feature's pooled vector no longer reaches the interaction by itself:
its tower's module maps the tower's features ``[B, D_t]`` to ``[B, O_t]``, and the
interaction sees that output as ``O_t / d`` vectors of the embedding width ``d``
beside the flat features' vectors. A ``dot`` tower's output ends with its features'
``n (n - 1) / 2`` pairwise dot products: those are the interaction's own terms for the
pairs inside the tower, so they go to the top MLP as they are, beside the
interaction's output (the vectors before them are read as above). The sparse part is
torchrec's own types: an ``EmbeddingBagCollection`` for flat features and an
``EmbeddingTowerCollection`` whose ``EmbeddingTower`` s hold each tower's tables and its
module (:class:`KeyedTower`), so the unsharded model is the reference and
``strategy="embark"`` shards it with towers.

The interaction and top MLP are torchrec's (``InteractionArch`` / ``InteractionDCNArch``
with its ``LowRankCrossNet``, ``DenseArch``, ``OverArch``), sized for ``F' = F_flat +
sum_t O_t / d`` sparse vectors as ``DLRM`` / ``DLRM_DCN`` size them for ``F``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torchrec.models.dlrm import DenseArch, InteractionArch, InteractionDCNArch, OverArch, choose
from torchrec.modules.crossnet import LowRankCrossNet
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.modules.embedding_tower import EmbeddingTower, EmbeddingTowerCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor, KeyedTensor

from lightning_embark.engine import tower_module
from lightning_embark.errors import ConfigError
from lightning_embark.plan import TowerModule, TowerRequest, dot_pairs


class KeyedTower(nn.Module):
    """A tower module as a torchrec ``EmbeddingTower`` interaction: it takes the tower's
    ``KeyedTensor`` and applies ``module`` to its values ``[B, D_t]``."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, embeddings: KeyedTensor) -> torch.Tensor:
        out: torch.Tensor = self.module(embeddings.values())
        return out


def tower_output_dim(request: TowerRequest, tables: int, dim: int) -> int:
    """``O_t`` of a DLRM tower of ``tables`` tables of width ``dim``: a whole number of
    ``dim``-wide vectors (the interaction's unit), ``dim * round(tables / ratio)`` (at
    least one) from a ratio.

    Raises:
        ConfigError: an explicit ``output_dim`` that is not a multiple of ``dim``.
    """
    if request.module is TowerModule.IDENTITY:
        return tables * dim
    if request.output_dim is not None:
        pairs = tower_scalars(request, tables)
        vectors = request.output_dim - pairs
        if vectors < 1 or vectors % dim:
            extra = f" plus its {pairs} pair terms" if pairs else ""
            raise ConfigError(
                f"tower {request.name!r}: output_dim {request.output_dim} must be a positive "
                f"multiple of the embedding dim {dim}{extra} (the interaction reads {dim}-wide "
                "vectors)"
            )
        return request.output_dim
    out = request.output_width([dim] * tables)
    assert out is not None  # TowerRequest checks one width is given
    return out


def tower_scalars(request: TowerRequest, tables: int) -> int:
    """Values at the end of a tower's output that the top MLP reads as they are: a ``dot``
    tower's pair terms, none for the other modules."""
    return dot_pairs(tables) if request.module is TowerModule.DOT else 0


def tower_collection(
    configs: Sequence[EmbeddingBagConfig],
    requests: Sequence[TowerRequest],
    *,
    dim: int,
    device: torch.device,
) -> tuple[EmbeddingTowerCollection, list[int]]:
    """torchrec's tower collection for ``requests`` (tables by spec name), and each
    tower's output width.

    Raises:
        ConfigError: a tower names an unknown table or a ``custom`` module (a DLRM builds
            its tower modules; use a torchrec ``EmbeddingTowerCollection`` for your own).
    """
    by_name = {c.name.removeprefix("t_"): c for c in configs}
    towers, widths = [], []
    for request in requests:
        unknown = sorted(set(request.tables) - set(by_name))
        if unknown:
            raise ConfigError(
                f"tower {request.name!r} names tables {unknown} that the model does not have "
                f"(tables: {sorted(by_name)})"
            )
        if request.module is TowerModule.CUSTOM:
            raise ConfigError(
                f"tower {request.name!r} is 'custom'; a DLRMModule builds identity, projection "
                "or dcn towers (put your own modules in a torchrec EmbeddingTowerCollection)"
            )
        mine = [by_name[t] for t in request.tables]
        out = tower_output_dim(request, len(mine), dim)
        inner: nn.Module = (
            nn.Identity()
            if request.module is TowerModule.IDENTITY
            else tower_module(request.module.value, len(mine) * dim, out, features=len(mine))
        )
        ebc = EmbeddingBagCollection(tables=mine, device=device)
        towers.append(EmbeddingTower(ebc, KeyedTower(inner)))
        widths.append(out)
    return EmbeddingTowerCollection(towers), widths


def tower_model(
    configs: Sequence[EmbeddingBagConfig],
    requests: Sequence[TowerRequest],
    *,
    embedding_dim: int,
    device: torch.device,
    **arch: Any,
) -> TowerDLRM:
    """A :class:`TowerDLRM` for ``configs`` with ``requests`` as towers (the rest flat)."""
    in_towers = {t for r in requests for t in r.tables}
    flat = [c for c in configs if c.name.removeprefix("t_") not in in_towers]
    towers, widths = tower_collection(configs, requests, dim=embedding_dim, device=device)
    return TowerDLRM(
        flat=EmbeddingBagCollection(tables=flat, device=device) if flat else None,
        towers=towers,
        tower_widths=widths,
        tower_scalars=[tower_scalars(r, len(r.tables)) for r in requests],
        embedding_dim=embedding_dim,
        **arch,
    )


class TowerDLRM(nn.Module):
    """DLRM (``"dot"``) or DLRM-DCNv2 (``"dcn"``) whose sparse part has towers.

    Args:
        flat: The flat features' collection (None when every feature is in a tower).
        towers: The tower collection.
        tower_widths: Each tower's output width: a multiple of ``embedding_dim``, plus
            its ``tower_scalars``.
        tower_scalars: Values at the end of each tower's output that go to the top MLP as
            they are (a ``dot`` tower's pair terms); None: none.
        embedding_dim: ``d``.
        dense_in_features: Dense inputs.
        dense_arch_layer_sizes: Bottom MLP (ends at ``d``).
        over_arch_layer_sizes: Top MLP (ends at 1).
        interaction: ``"dot"`` or ``"dcn"``.
        dcn_num_layers: Cross layers (dcn).
        dcn_low_rank_dim: Their rank (dcn).
    """

    def __init__(
        self,
        *,
        flat: EmbeddingBagCollection | None,
        towers: EmbeddingTowerCollection,
        tower_widths: Sequence[int],
        tower_scalars: Sequence[int] | None = None,
        embedding_dim: int,
        dense_in_features: int,
        dense_arch_layer_sizes: Sequence[int],
        over_arch_layer_sizes: Sequence[int],
        interaction: str,
        dcn_num_layers: int = 3,
        dcn_low_rank_dim: int = 512,
    ) -> None:
        super().__init__()
        self.flat = flat
        self.towers = towers
        self.embedding_dim = embedding_dim
        flat_features = (
            0 if flat is None else sum(len(c.feature_names) for c in flat.embedding_bag_configs())
        )
        self._flat_count = flat_features
        scalars = list(tower_scalars or [0] * len(tower_widths))
        if len(scalars) != len(tower_widths):
            raise ConfigError(
                f"tower_scalars has {len(scalars)} entries for {len(tower_widths)} towers"
            )
        self._widths = [(w - c, c) for w, c in zip(tower_widths, scalars, strict=True)]
        self._tower_count = sum(v // embedding_dim for v, _ in self._widths)
        count = self._flat_count + self._tower_count
        extra = sum(scalars)
        self.dense_arch = DenseArch(dense_in_features, list(dense_arch_layer_sizes))
        self.inter_arch: nn.Module
        if interaction == "dcn":
            crossnet = LowRankCrossNet(
                in_features=(count + 1) * embedding_dim,
                num_layers=dcn_num_layers,
                low_rank=dcn_low_rank_dim,
            )
            self.inter_arch = InteractionDCNArch(num_sparse_features=count, crossnet=crossnet)
            over_in = (count + 1) * embedding_dim
        else:
            self.inter_arch = InteractionArch(num_sparse_features=count)
            over_in = embedding_dim + choose(count, 2) + count
        self.over_arch = OverArch(over_in + extra, list(over_arch_layer_sizes))

    def forward(
        self, dense_features: torch.Tensor, sparse_features: KeyedJaggedTensor
    ) -> torch.Tensor:
        """Logits ``[B, 1]``."""
        dense = self.dense_arch(dense_features)
        size, dim = dense.shape
        parts = []
        if self.flat is not None:
            flat = self.flat(sparse_features).values()
            parts.append(flat.reshape(size, self._flat_count, dim))
        towers = self.towers(sparse_features)
        vectors, scalars, start = [], [], 0
        for width, extra in self._widths:
            vectors.append(towers[:, start : start + width])
            scalars.append(towers[:, start + width : start + width + extra])
            start += width + extra
        parts.append(torch.cat(vectors, dim=1).reshape(size, self._tower_count, dim))
        inter = self.inter_arch(dense, torch.cat(parts, dim=1))
        out: torch.Tensor = self.over_arch(torch.cat([inter, *scalars], dim=1))
        return out
