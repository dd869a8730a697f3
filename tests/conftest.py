"""Suite-wide setup: the tests are CPU-only, so Triton kernels run in Triton's interpreter.

``TRITON_INTERPRET=1`` must be set before triton is first imported (torchrec and fbgemm
import it), so it is set here, before any test module is collected.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import logging
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from lightning_embark.testing._ranks import load_module

TESTS = Path(__file__).resolve().parent


@pytest.fixture(scope="session")
def synthetic() -> ModuleType:
    """The synthetic-batch helper ``tests/models/synthetic.py``, loaded by path (tests are no
    package)."""
    return load_module(TESTS / "models" / "synthetic.py", "_embark_test_synthetic")


@pytest.fixture
def triton_cpu() -> str:
    """The backend name that runs the Triton kernels on CPU tensors (interpreter).

    ``TRITON_INTERPRET=1`` only takes effect if it is set before ``triton`` is first
    imported (triton's own ``tl.max``, ``tl.zeros``... are jit functions decorated at
    import); in a run where something imported triton first, these tests skip and
    ``tests/kernels/test_interpreter_suite.py`` reruns the kernel tests in a fresh process.
    """
    from lightning_embark.kernels._ops import interpreted

    if not interpreted():
        pytest.skip(
            "triton was imported before TRITON_INTERPRET=1; test_interpreter_suite.py reruns this"
        )
    return "triton"


@pytest.fixture
def single_rank_world() -> Iterator[None]:
    """Lightning initialises a 1-rank process group and sets launcher variables in this
    process; undo both so later tests and launches start clean."""
    import torch.distributed as dist

    from lightning_embark.registry import register_strategies

    saved = dict(os.environ)
    register_strategies()
    yield
    if dist.is_initialized():
        dist.destroy_process_group()
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture(autouse=True)
def _restore_log_levels() -> Iterator[None]:
    """Every logger's level as it was before the test: a benchmark's ``quiet()`` run
    in-process (``lightning.pytorch`` at ERROR) must not hide the log records that later
    tests, and the ranks they start, look for."""
    loggers = [logging.getLogger()] + [
        logger
        for logger in logging.Logger.manager.loggerDict.values()
        if isinstance(logger, logging.Logger)
    ]
    saved = [(logger, logger.level, logger.disabled) for logger in loggers]
    yield
    for logger, level, disabled in saved:
        logger.setLevel(level)
        logger.disabled = disabled
