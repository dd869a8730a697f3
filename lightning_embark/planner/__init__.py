"""Greedy sharding planner with a calibrated, topology-aware cost model."""
