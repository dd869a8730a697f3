"""Fixtures for model tests: the synthetic-batch helper, loaded by path."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest


def load_helper(name: str) -> ModuleType:
    """Import ``tests/models/<name>.py`` without making tests a package."""
    path = Path(__file__).with_name(f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"_embark_test_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def synthetic() -> ModuleType:
    """The synthetic-batch helper module."""
    return load_helper("synthetic")
