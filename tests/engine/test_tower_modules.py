"""The built-in tower modules: shapes, the dot tower's exact pair terms, bad widths named."""

from __future__ import annotations

import pytest
import torch

from lightning_embark.engine import DotTower, tower_module
from lightning_embark.errors import ConfigError


def test_a_dot_tower_sends_its_projection_then_its_exact_pairs() -> None:
    torch.manual_seed(0)
    tower = tower_module("dot", 4 * 3, 5 + 6, features=4)
    assert isinstance(tower, DotTower)
    x = torch.randn(7, 12)
    out = tower(x)
    assert out.shape == (7, 11)
    e = x.reshape(7, 4, 3)
    pairs = [(i, j) for i in range(4) for j in range(i + 1, 4)]
    expected = torch.stack([(e[:, i] * e[:, j]).sum(1) for i, j in pairs], dim=1)
    torch.testing.assert_close(out[:, 5:], expected)
    torch.testing.assert_close(out[:, :5], tower.projection(x))
    # Gradients reach the input through both parts.
    x.requires_grad_(True)
    tower(x)[:, -1].sum().backward()
    assert x.grad is not None
    assert torch.equal(x.grad[:, 3:6], torch.zeros(7, 3)), "pair (2, 3) only reads e_2, e_3"


@pytest.mark.parametrize(
    ("in_dim", "out_dim", "features", "message"),
    [
        (10, 8, 4, "not a multiple"),
        (12, 6, 4, "6 pair terms"),
        (12, 6, None, "needs its number of features"),
    ],
)
def test_bad_dot_tower_widths_are_named(
    in_dim: int, out_dim: int, features: int | None, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        tower_module("dot", in_dim, out_dim, features=features)


def test_an_unknown_kind_names_the_choices() -> None:
    with pytest.raises(ConfigError, match="'projection', 'dcn' or 'dot'"):
        tower_module("mlp", 4, 2)
