"""EmulationConfig validation: bad options fail early with a ConfigError naming value and fix."""

from __future__ import annotations

import pytest

from lightning_embark.emulation import DEFAULT_RATE_MBIT, EmulationConfig
from lightning_embark.errors import ConfigError


def test_defaults_and_addresses():
    config = EmulationConfig(num_hosts=3, ranks_per_host=2)
    assert config.rate_mbit == DEFAULT_RATE_MBIT
    assert config.delay_ms == 0.0
    assert config.world_size == 6
    assert [config.host_address(h) for h in range(3)] == ["10.77.0.1", "10.77.0.2", "10.77.0.3"]
    assert EmulationConfig.from_dict(config.to_dict()) == config


def test_unshaped_rate_is_allowed():
    assert EmulationConfig(num_hosts=2, ranks_per_host=1, rate_mbit=None).rate_mbit is None


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(num_hosts=0, ranks_per_host=2), "num_hosts must be a positive integer, got 0"),
        (dict(num_hosts=2, ranks_per_host=1.5), "ranks_per_host must be a positive integer"),
        (dict(num_hosts=True, ranks_per_host=2), "num_hosts must be a positive integer"),
        (dict(num_hosts=2, ranks_per_host=2, rate_mbit=0), "rate_mbit=0 is outside"),
        (dict(num_hosts=2, ranks_per_host=2, rate_mbit=-5.0), "rate_mbit=-5.0"),
        (
            dict(num_hosts=2, ranks_per_host=2, rate_mbit="fast"),
            "rate_mbit must be a number or None",
        ),
        (dict(num_hosts=2, ranks_per_host=2, delay_ms=-1), "delay_ms=-1 must be within"),
        (dict(num_hosts=2, ranks_per_host=2, jitter_ms=-1), "jitter_ms must be a number >= 0"),
        (dict(num_hosts=2, ranks_per_host=2, delay_ms=5, jitter_ms=6), "jitter_ms=6 is larger"),
        (dict(num_hosts=2, ranks_per_host=2, loss_percent=101), "loss_percent=101 is larger"),
        (dict(num_hosts=2, ranks_per_host=2, loss_percent="1%"), "loss_percent must be a num"),
        (dict(num_hosts=2, ranks_per_host=2, subnet="10.77.0.0/33"), "not a valid network"),
        (dict(num_hosts=2, ranks_per_host=2, subnet="10.77.0.1/24"), "not a valid network"),
        (dict(num_hosts=2, ranks_per_host=2, subnet="fd00::/64"), "must be an IPv4 network"),
        (
            dict(num_hosts=7, ranks_per_host=1, subnet="10.77.0.0/29"),
            "6 host addresses but num_hosts=7",
        ),
        (dict(num_hosts=2, ranks_per_host=2, name_prefix="embark"), "must be a letter"),
        (dict(num_hosts=2, ranks_per_host=2, name_prefix="a b-"), "name_prefix='a b-'"),
    ],
)
def test_invalid_options(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        EmulationConfig(**kwargs)


def test_config_is_keyword_only():
    with pytest.raises(TypeError):
        EmulationConfig(2, 2)  # type: ignore[misc]


def test_unknown_field_in_dict():
    with pytest.raises(ConfigError, match=r"unknown EmulationConfig fields \['hosts'\]"):
        EmulationConfig.from_dict({"hosts": 2, "num_hosts": 2, "ranks_per_host": 1})


def test_host_address_out_of_range():
    with pytest.raises(ConfigError, match="host 2 is outside a cluster of 2 hosts"):
        EmulationConfig(num_hosts=2, ranks_per_host=1).host_address(2)
