"""Cluster topology: hosts, ranks per host, memory and link characteristics.

The planner's cost model and the byte accounting both need to know which ranks
share a host (fast links) and which talk across hosts (slow links). Presets give
datasheet figures for DGX machines and the measured figures of the emulated
cluster (docs/architecture.md#hardware-figures, #the-emulated-cluster).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from lightning_embark._dictconfig import DictConfig
from lightning_embark.errors import ConfigError

GIB = 1 << 30


@dataclass(frozen=True, kw_only=True)
class Topology(DictConfig):
    """A homogeneous cluster of ``num_hosts`` x ``ranks_per_host`` ranks.

    Bandwidths are per rank and per direction, in bytes per second; latencies in
    seconds. Rank ``r`` lives on host ``r // ranks_per_host`` (torchrun's order).

    Attributes:
        name: Preset or user label, carried into reports.
        num_hosts: Number of hosts (nodes).
        ranks_per_host: Ranks (GPUs or processes) per host.
        memory_per_rank: Bytes available for embeddings per rank, or None if unbounded.
        intra_host_bandwidth: Bytes/s one rank can send to peers on its host.
        inter_host_bandwidth: Bytes/s one rank can send to other hosts.
        intra_host_latency: Per-message latency on the host's links, in seconds.
        inter_host_latency: Per-message latency across hosts, in seconds.
        source: Where the figures come from (datasheet, measurement).
    """

    name: str = "custom"
    num_hosts: int
    ranks_per_host: int
    memory_per_rank: int | None = None
    intra_host_bandwidth: float
    inter_host_bandwidth: float
    intra_host_latency: float = 0.0
    inter_host_latency: float = 0.0
    source: str = ""

    def __post_init__(self) -> None:
        for field in ("num_hosts", "ranks_per_host"):
            value = getattr(self, field)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"Topology.{field} must be a positive integer, got {value!r}")
        for field in ("intra_host_bandwidth", "inter_host_bandwidth"):
            value = getattr(self, field)
            if not value > 0:
                raise ConfigError(f"Topology.{field} must be > 0 bytes/s, got {value!r}")
        for field in ("intra_host_latency", "inter_host_latency"):
            value = getattr(self, field)
            if value < 0:
                raise ConfigError(f"Topology.{field} must be >= 0 seconds, got {value!r}")
        if self.memory_per_rank is not None and self.memory_per_rank <= 0:
            raise ConfigError(
                f"Topology.memory_per_rank must be > 0 bytes or None, got {self.memory_per_rank!r}"
            )

    @property
    def world_size(self) -> int:
        """Total number of ranks."""
        return self.num_hosts * self.ranks_per_host

    def host_of(self, rank: int) -> int:
        """The host index of a global rank."""
        if not 0 <= rank < self.world_size:
            raise ConfigError(f"rank {rank} is outside a world of {self.world_size} ranks")
        return rank // self.ranks_per_host

    def local_rank_of(self, rank: int) -> int:
        """The rank's index within its host."""
        return rank % self.ranks_per_host

    def same_host(self, rank_a: int, rank_b: int) -> bool:
        """Whether two ranks share a host (and so the fast links)."""
        return self.host_of(rank_a) == self.host_of(rank_b)

    def host_ranks(self, host: int) -> list[int]:
        """Global ranks on ``host``, in local-rank order."""
        return list(range(host * self.ranks_per_host, (host + 1) * self.ranks_per_host))

    def with_shape(self, *, num_hosts: int, ranks_per_host: int) -> Topology:
        """The same link and memory figures with another cluster shape."""
        return dataclasses.replace(self, num_hosts=num_hosts, ranks_per_host=ranks_per_host)


#: Overrides the ranks per host read from the launcher (emulated hosts on one machine).
RANKS_PER_HOST_ENV = "EMBARK_RANKS_PER_HOST"
_RANKS_PER_HOST_VARS = (RANKS_PER_HOST_ENV, "LOCAL_WORLD_SIZE")


def ranks_per_host_from_env(world_size: int, *, default: int | None = None) -> int:
    """Ranks per host: ``EMBARK_RANKS_PER_HOST``, else ``LOCAL_WORLD_SIZE``, else ``default``.

    Args:
        world_size: Total ranks; the answer must divide it.
        default: Used when neither variable is set (Lightning's own launcher sets no
            ``LOCAL_WORLD_SIZE``; its devices per node are the natural default).

    Raises:
        ConfigError: a variable is not a positive integer dividing ``world_size``.
    """
    for var in _RANKS_PER_HOST_VARS:
        raw = os.environ.get(var, "").strip()
        if not raw:
            continue
        try:
            value = int(raw)
        except ValueError:
            raise ConfigError(
                f"{var}={raw!r} is not an integer; set it to the ranks per host"
            ) from None
        if value < 1 or world_size % value:
            raise ConfigError(
                f"{var}={value} must be a positive divisor of the world size {world_size}"
            )
        return value
    value = default or world_size
    if world_size % value:
        raise ConfigError(f"{value} ranks per host do not divide the world size {world_size}")
    return value


# Datasheet figures (docs/architecture.md#hardware-figures), bytes/s per GPU and, as the
# cost model reads every bandwidth, PER DIRECTION:
# - intra_host_bandwidth: NVLink 4, 18 links, 900 GB/s per H100/H200 SXM GPU both directions
#   together, so 450 GB/s per direction (line rate; NCCL on NVSwitch reaches less).
# - inter_host_bandwidth: one ConnectX-7 NDR InfiniBand port per GPU, 400 Gb/s = 50 GB/s per
#   direction (line rate, no protocol efficiency applied).
# - latencies: 2 us inside a host, 5 us across hosts per peer: assumptions, not datasheet.
# - memory_per_rank: the GPU's whole HBM; nothing kept back for the dense model,
#   activations, the CUDA context or NCCL buffers.
_PRESETS: dict[str, dict] = {
    "dgx-h100": dict(
        ranks_per_host=8,
        memory_per_rank=80 * 10**9,
        intra_host_bandwidth=450e9,
        inter_host_bandwidth=50e9,
        intra_host_latency=2e-6,
        inter_host_latency=5e-6,
        source="datasheet: H100 SXM 80 GB HBM3, NVLink 450 GB/s and 400 Gb/s NIC per GPU and "
        "direction",
    ),
    "dgx-h200": dict(
        ranks_per_host=8,
        memory_per_rank=141 * 10**9,
        intra_host_bandwidth=450e9,
        inter_host_bandwidth=50e9,
        intra_host_latency=2e-6,
        inter_host_latency=5e-6,
        source="datasheet: H200 SXM 141 GB HBM3e, NVLink 450 GB/s and 400 Gb/s NIC per GPU and "
        "direction",
    ),
    # Measured here (docs/architecture.md#the-emulated-cluster): gloo loopback all-to-all
    # ~0.7-1.1 GB/s, an 800 Mbit shaped veth ~55 MB/s; the default shaping keeps intra:inter ~16:1.
    # Latencies per peer and call, as embark-calibrate fits them at 400 Mbit/s (median
    # of three runs: 0.66, 0.73, 0.84 ms inside a host; 0.23, 0.28, 0.50 ms across):
    # mostly gloo's per-call work, not the wire (one run at 800 Mbit/s fitted 0.85 ms
    # inside a host and 0 across, the intercept clipped).
    "emulated": dict(
        ranks_per_host=2,
        memory_per_rank=4 * GIB,
        intra_host_bandwidth=0.9e9,
        inter_host_bandwidth=55e6,
        intra_host_latency=730e-6,
        inter_host_latency=280e-6,
        source="measured: gloo over loopback inside a host, veth shaped with tc across hosts",
    ),
}


def preset_names() -> list[str]:
    """Names accepted by :func:`topology_preset`."""
    return sorted(_PRESETS)


def topology_preset(
    name: str, *, num_hosts: int = 1, ranks_per_host: int | None = None
) -> Topology:
    """A preset topology, optionally reshaped.

    Args:
        name: One of :func:`preset_names`.
        num_hosts: Number of hosts.
        ranks_per_host: Overrides the preset's ranks per host.

    Raises:
        ConfigError: ``name`` is not a preset; the message lists the known ones.
    """
    if name not in _PRESETS:
        raise ConfigError(f"unknown topology preset {name!r}; known presets: {preset_names()}")
    fields = dict(_PRESETS[name])
    if ranks_per_host is not None:
        fields["ranks_per_host"] = ranks_per_host
    return Topology(name=name, num_hosts=num_hosts, **fields)


def resolve_topology(
    topology: Topology | str | None,
    *,
    world_size: int,
    default_ranks_per_host: int | None = None,
) -> Topology:
    """Our topology for a run of ``world_size`` ranks.

    Args:
        topology: A :class:`Topology` (must match ``world_size``), a preset name
            reshaped to the launch environment, or None for the ``emulated`` preset so
            reshaped.
        world_size: Ranks in the process group.
        default_ranks_per_host: See :func:`ranks_per_host_from_env`.

    Raises:
        ConfigError: the topology's world size differs from the process group's, or
            the preset or environment is invalid.
    """
    if isinstance(topology, Topology):
        if topology.world_size != world_size:
            raise ConfigError(
                f"topology {topology.name!r} has {topology.num_hosts} hosts x "
                f"{topology.ranks_per_host} ranks = {topology.world_size} ranks, but the job "
                f"runs {world_size}; pass a topology of that size or None to derive it"
            )
        return topology
    per_host = ranks_per_host_from_env(world_size, default=default_ranks_per_host)
    return topology_preset(
        topology or "emulated", num_hosts=world_size // per_host, ranks_per_host=per_host
    )
