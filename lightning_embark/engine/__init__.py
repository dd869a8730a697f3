"""The EMBark engine: executing a sharding plan with embedding clusters."""

from lightning_embark.engine.plan import ClusterPlan, ClusterType, Compression, Plan, RowSplit, TableLayout

__all__ = ["ClusterPlan", "ClusterType", "Compression", "Plan", "RowSplit", "TableLayout"]
