"""Embedding clusters (EMBark): DP, RB and UB, behind one small base class.

:func:`make_cluster` picks the implementation of a plan cluster's type.
"""

from __future__ import annotations

from lightning_embark.engine._routing import ClusterRoutes
from lightning_embark.engine.clusters._base import Cluster, EngineOptions
from lightning_embark.engine.clusters._dp import DPCluster
from lightning_embark.engine.clusters._rb import RBCluster
from lightning_embark.engine.clusters._remote import RemoteCluster
from lightning_embark.engine.clusters._ub import UBCluster
from lightning_embark.engine.clusters._unique import dedupe, pool_unique, unique_row_grads
from lightning_embark.plan import ClusterType

__all__ = [
    "Cluster",
    "DPCluster",
    "EngineOptions",
    "RBCluster",
    "RemoteCluster",
    "UBCluster",
    "dedupe",
    "make_cluster",
    "pool_unique",
    "unique_row_grads",
]

_KINDS: dict[ClusterType, type[Cluster]] = {
    ClusterType.DP: DPCluster,
    ClusterType.RB: RBCluster,
    ClusterType.UB: UBCluster,
}


def make_cluster(routes: ClusterRoutes, rank: int, options: EngineOptions) -> Cluster:
    """The cluster implementation for the plan's cluster type."""
    return _KINDS[routes.cluster.type](routes, rank, options)
