"""``EngineConfig``: one default per engine option, shared by the engine, the sharded
collections, ``EmbarkStrategy`` and ``embark-bench``; bad values refused by name."""

from __future__ import annotations

import inspect

import pytest

from lightning_embark.engine import EmbeddingEngine, EngineConfig
from lightning_embark.errors import ConfigError
from lightning_embark.harness import BenchConfig
from lightning_embark.strategies import EmbarkStrategy


def test_the_strategy_and_the_bench_take_the_engines_defaults() -> None:
    config = EngineConfig()
    signature = inspect.signature(EmbarkStrategy.__init__).parameters
    for name in ("store", "seed", "pipeline", "overlap"):
        assert signature[name].default == getattr(config, name), name
    assert EmbarkStrategy().options.engine == config
    bench = BenchConfig(model="demo-small")
    assert (bench.pipeline, bench.overlap) == (config.pipeline, config.overlap)
    assert inspect.signature(EmbeddingEngine.__init__).parameters["config"].default is None


def test_the_strategys_options_reach_its_engine_config_whole() -> None:
    strategy = EmbarkStrategy(store="torch", seed=3, pipeline=False, overlap=False)
    assert strategy.options.engine == EngineConfig(
        store="torch", seed=3, pipeline=False, overlap=False
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"store": "cuda"}, r"engine store='cuda' is unknown; use one of \['auto', "),
        ({"seed": 1.5}, "engine seed must be an int, got 1.5"),
        ({"seed": True}, "engine seed must be an int, got True"),
        ({"pipeline": "yes"}, "engine pipeline must be True or False, got 'yes'"),
        ({"overlap": 1}, "engine overlap must be True or False, got 1"),
    ],
)
def test_bad_values_are_refused_by_name(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        EngineConfig(**kwargs)


def test_the_strategy_says_the_value_was_its_own() -> None:
    with pytest.raises(ConfigError, match="EmbarkStrategy: engine store='cuda' is unknown"):
        EmbarkStrategy(store="cuda")
