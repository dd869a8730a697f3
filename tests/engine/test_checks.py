"""An engine stays on the device it was built on: a conversion that would move it (its tower
modules, without its blocks, optimizer state, streams and group) is refused by name."""

from __future__ import annotations

import pytest
import torch

from lightning_embark.engine import EmbeddingEngine, EngineConfig, OptimizerKind, SparseOptimizer
from lightning_embark.engine._checks import refuse_move
from lightning_embark.errors import ConfigError
from lightning_embark.gpucheck._scenario import build
from lightning_embark.testing import run_gloo_ranks


def test_a_conversion_that_keeps_the_device_passes_and_one_that_moves_raises() -> None:
    cpu = torch.device("cpu")
    refuse_move(lambda t: t.double(), cpu)
    refuse_move(lambda t: t.to("cpu"), cpu)
    with pytest.raises(ConfigError, match=r"lives on cpu .* cannot move to meta.*device='meta'"):
        refuse_move(lambda t: t.to("meta"), cpu)


def _moves(rank: int, world: int) -> None:
    scenario = build(world, batch=4)
    engine = EmbeddingEngine(
        scenario.tables,
        scenario.plan,
        sparse_optimizer=SparseOptimizer(kind=OptimizerKind.SGD),
        config=EngineConfig(store="torch"),
    )
    assert engine.to("cpu") is engine and engine.cpu() is engine
    with pytest.raises(ConfigError, match="cannot move to meta"):
        engine.to("meta")
    with pytest.raises(ConfigError, match="cannot move to meta"):
        torch.nn.Sequential(engine).to("meta")  # inside a model, as Lightning moves it
    assert engine.device == torch.device("cpu")
    engine.close()


@pytest.mark.multiprocess
def test_an_engine_refuses_to_be_moved_off_its_device() -> None:
    run_gloo_ranks(_moves, 1)
