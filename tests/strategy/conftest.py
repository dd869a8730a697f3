"""Shared helpers of the embark strategy tests (loaded as fixtures: no packages under importlib)."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch.distributed as dist

from lightning_embark.registry import register_strategies

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="session")
def synthetic():
    """The synthetic-batch helper of ``tests/models``, loaded by path."""
    path = HERE.parent / "models" / "synthetic.py"
    spec = importlib.util.spec_from_file_location("_embark_test_synthetic", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def single_rank_world() -> Iterator[None]:
    """Lightning initialises a 1-rank process group and sets launcher variables in this
    process; undo both so later tests and launches start clean."""
    saved = dict(os.environ)
    register_strategies()
    yield
    if dist.is_initialized():
        dist.destroy_process_group()
    os.environ.clear()
    os.environ.update(saved)
