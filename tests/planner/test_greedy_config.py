"""Greedy planner knobs: a bad one is named where it is set."""

from __future__ import annotations

import pytest

from lightning_embark.errors import ConfigError
from lightning_embark.planner._greedy_config import GreedyConfig


def test_bad_config_is_named() -> None:
    with pytest.raises(ConfigError, match="memory_fraction"):
        GreedyConfig(memory_fraction=0)
    with pytest.raises(ValueError):
        GreedyConfig(allow=("fp4",))
