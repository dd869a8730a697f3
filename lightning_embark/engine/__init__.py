"""The EMBark engine: executing a sharding plan with embedding clusters.

The plan types import eagerly; the execution pieces (sharded module, exchanges,
volumes, the rule-based plan) load on first use, so reading or writing a plan does
not pull in the kernels.
"""

from __future__ import annotations

import importlib
from typing import Any

from lightning_embark.engine.plan import ClusterPlan, ClusterType, Compression, Plan, RowSplit, TableLayout

_LAZY = {
    "ShardedEmbeddingBagCollection": "lightning_embark.engine.sharded",
    "LocalShard": "lightning_embark.engine.sharded",
    "SparseOptimizer": "lightning_embark.engine.lookup",
    "OptimizerKind": "lightning_embark.engine.lookup",
    "AllToAll": "lightning_embark.engine.exchange",
    "FlatAllToAll": "lightning_embark.engine.exchange",
    "HierarchicalAllToAll": "lightning_embark.engine.exchange",
    "make_exchange": "lightning_embark.engine.exchange",
    "analytic_bytes": "lightning_embark.engine.volume",
    "LinkBytes": "lightning_embark.engine.volume",
    "StepBytes": "lightning_embark.engine.volume",
    "rule_based_plan": "lightning_embark.engine.rule",
    "ReferenceOptimizer": "lightning_embark.engine.reference",
}

__all__ = ["ClusterPlan", "ClusterType", "Compression", "Plan", "RowSplit", "TableLayout", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
