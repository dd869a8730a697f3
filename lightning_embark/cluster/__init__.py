"""Emulated multi-host cluster: network namespaces joined by ``tc``-shaped veth links.

DESIGN.md section 6. One machine plays H hosts so that intra-host (loopback, fast)
and inter-host (shaped veth, slow) links differ as NVLink and a NIC do. Without root
or iproute2 the same jobs run on plain loopback and say so.
"""

from lightning_embark.cluster.config import DEFAULT_RATE_MBIT, ClusterConfig
from lightning_embark.cluster.emulated import ClusterFallbackWarning, EmulatedCluster
from lightning_embark.cluster.measure import LinkMeasurement, measure_link, measure_pair
from lightning_embark.cluster.netns import cleanup_stale
from lightning_embark.cluster.state import attach_cluster

__all__ = [
    "DEFAULT_RATE_MBIT",
    "ClusterConfig",
    "ClusterFallbackWarning",
    "EmulatedCluster",
    "LinkMeasurement",
    "attach_cluster",
    "cleanup_stale",
    "measure_link",
    "measure_pair",
]
