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

Any ``nn.Module`` with the same contract can be a tower module too.
"""

from __future__ import annotations

import torch
from torch import nn

from lightning_embark.errors import ConfigError


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


def tower_module(
    kind: str, in_dim: int, out_dim: int, *, device: torch.device | str | None = None
) -> nn.Module:
    """The built-in tower module of ``kind`` (``projection`` or ``dcn``), its parameters on
    ``device`` (None: torch's default device)."""
    if kind == "projection":
        return ProjectionTower(in_dim, out_dim, device=device)
    if kind == "dcn":
        return DCNTower(in_dim, out_dim, device=device)
    raise ConfigError(
        f"no built-in tower module {kind!r}; choose 'projection' or 'dcn', or pass your own "
        "module for a 'custom' tower"
    )


def _check_dims(in_dim: int, out_dim: int) -> None:
    if in_dim < 1 or out_dim < 1:
        raise ConfigError(
            f"a tower module needs positive widths, got in_dim={in_dim}, out_dim={out_dim}"
        )
