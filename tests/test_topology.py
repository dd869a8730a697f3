"""Topology: presets, rank-to-host map, validation."""

from __future__ import annotations

import pytest

from lightning_embark.errors import ConfigError
from lightning_embark.topology import Topology, preset_names, topology_preset


def test_presets() -> None:
    assert set(preset_names()) == {"dgx-h100", "dgx-h200", "emulated"}
    h100 = topology_preset("dgx-h100", num_hosts=8)
    assert h100.world_size == 64 and h100.ranks_per_host == 8
    # NVLink 4: 450 GB/s per direction against a 400 Gb/s (50 GB/s) NIC per GPU.
    assert h100.intra_host_bandwidth / h100.inter_host_bandwidth == pytest.approx(9)
    assert topology_preset("dgx-h200").memory_per_rank > h100.memory_per_rank
    assert "datasheet" in h100.source
    emulated = topology_preset("emulated", num_hosts=2, ranks_per_host=2)
    assert emulated.world_size == 4 and "measured" in emulated.source


def test_rank_to_host_map() -> None:
    topo = topology_preset("emulated", num_hosts=3, ranks_per_host=2)
    assert [topo.host_of(r) for r in range(6)] == [0, 0, 1, 1, 2, 2]
    assert [topo.local_rank_of(r) for r in range(6)] == [0, 1, 0, 1, 0, 1]
    assert topo.same_host(2, 3) and not topo.same_host(1, 2)
    assert topo.host_ranks(2) == [4, 5]
    with pytest.raises(ConfigError, match="rank 6 is outside a world of 6"):
        topo.host_of(6)


def test_round_trip_and_reshape() -> None:
    topo = topology_preset("dgx-h100", num_hosts=2)
    assert Topology.from_dict(topo.to_dict()) == topo
    assert topo.with_shape(num_hosts=16, ranks_per_host=8).world_size == 128
    with pytest.raises(ConfigError, match="unknown Topology fields"):
        Topology.from_dict(topo.to_dict() | {"gpus": 8})


def test_validation_and_unknown_preset() -> None:
    with pytest.raises(ConfigError, match="num_hosts must be a positive integer"):
        Topology(num_hosts=0, ranks_per_host=1, intra_host_bandwidth=1.0, inter_host_bandwidth=1.0)
    with pytest.raises(ConfigError, match="inter_host_bandwidth must be > 0"):
        Topology(num_hosts=1, ranks_per_host=1, intra_host_bandwidth=1.0, inter_host_bandwidth=0.0)
    with pytest.raises(ConfigError, match="known presets"):
        topology_preset("dgx-a100")
