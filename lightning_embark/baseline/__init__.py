"""The torchrec baseline: ``DistributedModelParallel`` with torchrec's own planner.

Pure pieces the ``strategy="torchrec"`` shell (:mod:`lightning_embark.strategies.torchrec`)
composes: torchrec's planner fed with our topology and the spec's statistics
(:mod:`.torchrec_planning`), sharders that allow every sharding type on CPU/gloo
(:mod:`.sharders`), the DMP wrap (:mod:`.dmp`), and our plan to and from torchrec's
``ShardingPlan`` (:mod:`.plan_io`).
"""

from __future__ import annotations

from lightning_embark.baseline.dmp import apply_sparse_optimizer, shard_module
from lightning_embark.baseline.plan_io import (
    TorchrecPlanning,
    plan_from_torchrec,
    plan_to_torchrec,
    torchrec_plan,
)
from lightning_embark.baseline.sharders import AllShardingTypesEBCSharder, make_sharders
from lightning_embark.baseline.torchrec_planning import (
    constraints_from_spec,
    plan_summary,
    plan_table_layout,
    plan_with_torchrec,
    to_torchrec_topology,
)

__all__ = [
    "AllShardingTypesEBCSharder",
    "TorchrecPlanning",
    "apply_sparse_optimizer",
    "constraints_from_spec",
    "make_sharders",
    "plan_from_torchrec",
    "plan_summary",
    "plan_table_layout",
    "plan_to_torchrec",
    "plan_with_torchrec",
    "shard_module",
    "to_torchrec_topology",
    "torchrec_plan",
]
