"""The torchrec baseline: ``DistributedModelParallel`` with torchrec's own planner.

Pure pieces the ``strategy="torchrec"`` shell (:mod:`lightning_embark.strategies._torchrec`)
composes: torchrec's planner fed with our topology and the spec's statistics
(:mod:`.torchrec_planning`), sharders that allow every sharding type on CPU/gloo
(:mod:`.sharders`), torchrec's own tower sharding made to run there (:mod:`.towers`), the
DMP wrap (:mod:`.dmp`), and our plan to and from torchrec's ``ShardingPlan``
(:mod:`.plan_io`).
"""

from __future__ import annotations

from lightning_embark.baseline._dmp import (
    apply_sparse_optimizer,
    as_shardable,
    check_qcomms_device,
    shard_module,
    sync_local_world_size,
)
from lightning_embark.baseline._plan_io import (
    TorchrecPlanning,
    plan_from_torchrec,
    plan_to_torchrec,
    torchrec_plan,
)
from lightning_embark.baseline._sharders import (
    AllShardingTypesEBCSharder,
    make_sharders,
    qcomms_config,
)
from lightning_embark.baseline._torchrec_planning import (
    constraints_from_spec,
    merge_constraints,
    plan_summary,
    plan_table_layout,
    plan_with_torchrec,
    to_torchrec_topology,
)
from lightning_embark.baseline._towers import (
    PARAMETERLESS_TOWER_REASON,
    TowerCollectionSharder,
    check_tower_modules,
    order_towers_by_host,
)

__all__ = [
    "PARAMETERLESS_TOWER_REASON",
    "AllShardingTypesEBCSharder",
    "TorchrecPlanning",
    "TowerCollectionSharder",
    "apply_sparse_optimizer",
    "as_shardable",
    "check_qcomms_device",
    "check_tower_modules",
    "constraints_from_spec",
    "make_sharders",
    "merge_constraints",
    "order_towers_by_host",
    "plan_from_torchrec",
    "plan_summary",
    "plan_table_layout",
    "plan_to_torchrec",
    "plan_with_torchrec",
    "qcomms_config",
    "shard_module",
    "sync_local_world_size",
    "to_torchrec_topology",
    "torchrec_plan",
]
