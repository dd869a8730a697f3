"""Emulated hosts: network namespaces joined by ``tc``-shaped veth links (``embark-cluster``).

One machine plays H hosts so that intra-host (loopback, fast)
and inter-host (shaped veth, slow) links differ as NVLink and a NIC do. Without root
or iproute2 the same jobs run on plain loopback and say so.
"""

from lightning_embark.emulation.config import DEFAULT_RATE_MBIT, EmulationConfig
from lightning_embark.emulation.hosts import EmulatedHosts, EmulationFallbackWarning
from lightning_embark.emulation.measure import LinkMeasurement, measure_link, measure_pair
from lightning_embark.emulation.netns import cleanup_stale
from lightning_embark.emulation.state import attach_hosts

__all__ = [
    "DEFAULT_RATE_MBIT",
    "EmulatedHosts",
    "EmulationConfig",
    "EmulationFallbackWarning",
    "LinkMeasurement",
    "attach_hosts",
    "cleanup_stale",
    "measure_link",
    "measure_pair",
]
