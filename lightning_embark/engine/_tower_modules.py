"""Tower modules (DMT): what runs on a tower's host before its output crosses hosts.

A tower module maps the tower's pooled embeddings, concatenated feature by feature
into ``x`` of shape ``[N, D_t]`` (``D_t = sum(d)`` over its features), to its output
``[N, O_t]``. Only the output crosses hosts, so ``D_t / O_t`` is the factor by which a
tower shrinks the embedding traffic between hosts, forward and backward.

DMT (Luo et al., MLSys 2024) puts a small dense network here; its exact architecture
is not public. These two are this project's design:

* :class:`ProjectionTower`: ``y = x W^T + b``, one linear map ``D_t -> O_t``.
* :class:`DCNTower`: one DCN-v2 cross layer over the tower's features, then the
  projection: ``y = P(x + x * (x V^T + c))``. The cross term lets the features of a
  tower interact before they are compressed, which is why the partitioner puts
  features that interact into one tower.
* :class:`DotTower`: the tower's own part of a dot interaction, exact, beside the
  projection: ``y = [x W^T + b, (<e_i, e_j>)_{i<j}]`` for its ``n`` equal-width feature
  vectors ``e_i``. The ``n (n - 1) / 2`` pair terms are what DLRM's interaction would
  compute among these features; they cost ``n (n - 1) / 2`` values on the wire
  instead of ``n d``, and the projection carries what the tower's features share with
  features elsewhere. The model reads the pair terms as they are (they go to the top
  MLP beside the interaction's own terms, :class:`~lightning_embark.models.DLRMModule`).
  Which features share a tower then decides which pairs are kept exactly: what the
  partitioner's affinity optimises.

Any ``nn.Module`` with the same contract can be a tower module too; :func:`tower_modules`
gives an engine the module of each of its plan's towers (the user's, or a built-in one).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import nn

from lightning_embark.engine._routing import FeatureInfo, TableInfo
from lightning_embark.errors import ConfigError
from lightning_embark.plan import Plan, TowerModule, dot_pairs


class ProjectionTower(nn.Module):
    """One linear map from the tower's width to its output width.

    Args:
        in_dim: ``D_t``, the tower's concatenated pooled width.
        out_dim: ``O_t``.
        device: Where its parameters live (the engine's device; None: torch's default).
    """

    def __init__(
        self, in_dim: int, out_dim: int, *, device: torch.device | str | None = None
    ) -> None:
        super().__init__()
        _check_dims(in_dim, out_dim)
        self.projection = nn.Linear(in_dim, out_dim, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.projection(x)


class DCNTower(nn.Module):
    """A DCN-v2 cross layer, ``x + x * (x V^T + c)``, then a projection to ``out_dim``.

    The cross weights start at zero so the tower starts as the plain projection: the
    interaction is learned, never imposed by the initialisation.

    Args:
        in_dim: ``D_t``.
        out_dim: ``O_t``.
        device: Where its parameters live (the engine's device; None: torch's default).
    """

    def __init__(
        self, in_dim: int, out_dim: int, *, device: torch.device | str | None = None
    ) -> None:
        super().__init__()
        _check_dims(in_dim, out_dim)
        self.cross = nn.Linear(in_dim, in_dim, device=device)
        nn.init.zeros_(self.cross.weight)
        nn.init.zeros_(self.cross.bias)
        self.projection = nn.Linear(in_dim, out_dim, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.projection(x + x * self.cross(x))


class DotTower(nn.Module):
    """The pairwise dot products of the tower's ``features`` vectors beside a projection:
    ``[x W^T + b, (<e_i, e_j>)_{i<j}]``, ``out_dim`` wide in all.

    Args:
        in_dim: ``D_t = features * d``.
        out_dim: ``O_t``: the projection's width plus the ``features (features - 1) / 2``
            pair terms (:func:`dot_pairs`).
        features: ``n``, the tower's feature vectors, all ``d = in_dim / n`` wide.
        device: Where its parameters live (the engine's device; None: torch's default).

    Raises:
        ConfigError: ``in_dim`` not a multiple of ``features``, or ``out_dim`` leaving the
            projection no width.
    """

    def __init__(
        self,
        in_dim: int,
        out_dim: int,
        *,
        features: int,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        _check_dims(in_dim, out_dim)
        if features < 1 or in_dim % features:
            raise ConfigError(
                f"a dot tower needs its {features} feature(s) of one width; in_dim={in_dim} is "
                "not a multiple (give its tables one embedding dim, or use a projection tower)"
            )
        pairs = dot_pairs(features)
        if out_dim <= pairs:
            raise ConfigError(
                f"a dot tower of {features} features sends their {pairs} pair terms; "
                f"out_dim={out_dim} leaves its projection no width (give it more than {pairs})"
            )
        self.features, self.dim, self.pairs = features, in_dim // features, pairs
        self.projection = nn.Linear(in_dim, out_dim - pairs, device=device)
        self.rows: torch.Tensor
        self.cols: torch.Tensor
        rows, cols = torch.triu_indices(features, features, offset=1, device=device)
        self.register_buffer("rows", rows, persistent=False)
        self.register_buffer("cols", cols, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        vectors = x.reshape(x.shape[0], self.features, self.dim)
        dots = torch.bmm(vectors, vectors.transpose(1, 2))[:, self.rows, self.cols]
        return torch.cat([self.projection(x), dots], dim=1)


def tower_module(
    kind: str,
    in_dim: int,
    out_dim: int,
    *,
    features: int | None = None,
    device: torch.device | str | None = None,
) -> nn.Module:
    """The built-in tower module of ``kind`` (``projection``, ``dcn`` or ``dot``: that one
    also needs its number of ``features``), its parameters on ``device`` (None: torch's
    default device)."""
    if kind == "projection":
        return ProjectionTower(in_dim, out_dim, device=device)
    if kind == "dcn":
        return DCNTower(in_dim, out_dim, device=device)
    if kind == "dot":
        if features is None:
            raise ConfigError("a dot tower module needs its number of features")
        return DotTower(in_dim, out_dim, features=features, device=device)
    raise ConfigError(
        f"no built-in tower module {kind!r}; choose 'projection', 'dcn' or 'dot', or pass "
        "your own module for a 'custom' tower"
    )


def _check_dims(in_dim: int, out_dim: int) -> None:
    if in_dim < 1 or out_dim < 1:
        raise ConfigError(
            f"a tower module needs positive widths, got in_dim={in_dim}, out_dim={out_dim}"
        )


def tower_modules(
    plan: Plan,
    tables: Sequence[TableInfo],
    features: Sequence[FeatureInfo],
    given: Mapping[str, nn.Module] | None,
    *,
    device: torch.device,
) -> dict[str, nn.Module]:
    """The module of every non-identity tower: the one given, else the built-in kind, built
    on ``device`` (the engine's: its input and output live there).

    Raises:
        ConfigError: a module given for a tower the plan does not have (or an identity
            one), a given module with tensors on another device, or a ``custom`` tower
            without its module.
    """
    given = dict(given or {})
    towers = {t.name: t for t in plan.towers}
    unknown = sorted(
        n for n in given if n not in towers or towers[n].module is TowerModule.IDENTITY
    )
    if unknown:
        raise ConfigError(
            f"tower modules given for {unknown}, which the plan has no non-identity towers of "
            f"(its towers: {[f'{t.name} ({t.module.value})' for t in plan.towers]})"
        )
    dims = {t.name: t.dim for t in tables}
    out: dict[str, nn.Module] = {}
    for tower in plan.towers:
        if tower.module is TowerModule.IDENTITY:
            continue
        if tower.name in given:
            out[tower.name] = _on_device(tower.name, given[tower.name], device)
            continue
        if tower.module is TowerModule.CUSTOM:
            raise ConfigError(
                f"tower {tower.name!r} is 'custom' but no module was given for it; pass "
                f"tower_modules={{{tower.name!r}: module}}"
            )
        mine = [dims[f.table] for f in features if f.table in tower.tables]
        assert tower.output_dim is not None  # TowerPlan checks it for non-identity towers
        out[tower.name] = tower_module(
            tower.module.value, sum(mine), tower.output_dim, features=len(mine), device=device
        )
    return out


def _on_device(name: str, module: nn.Module, device: torch.device) -> nn.Module:
    """``module``, checked to hold its parameters and buffers on ``device``.

    Raises:
        ConfigError: a tensor elsewhere (the engine does not move a user's module).
    """
    elsewhere = sorted(
        {str(t.device) for t in (*module.parameters(), *module.buffers()) if t.device != device}
    )
    if elsewhere:
        raise ConfigError(
            f"tower module {name!r} has tensors on {elsewhere} but the engine runs on {device}; "
            f"move it there first (module.to({str(device)!r})) or build the engine with "
            "device= its device"
        )
    return module
