"""The torchrec baseline: ``DistributedModelParallel`` with torchrec's own planner.

Pure pieces the ``strategy="torchrec"`` shell (:mod:`lightning_embark.strategies._torchrec`)
composes: torchrec's planner fed with our topology and the spec's statistics
(:mod:`.torchrec_planning`), sharders that allow every sharding type on CPU/gloo
(:mod:`.sharders`), torchrec's own tower sharding made to run there (:mod:`.towers`), the
DMP wrap (:mod:`.dmp`) with the dense gradients' wire format and traffic labels
(:mod:`.dense_hooks`), torchrec's train pipeline driven over a wrapper of the module
(:mod:`.pipeline`), and our plan to and from torchrec's ``ShardingPlan``
(:mod:`.plan_io`).
"""

from __future__ import annotations

from lightning_embark.baseline._dense_hooks import (
    DENSE_COMPRESSIONS,
    check_dense_compression,
    dense_hook,
)
from lightning_embark.baseline._dmp import (
    HookedDataParallelWrapper,
    apply_sparse_optimizer,
    as_shardable,
    check_qcomms_device,
    embedding_table_names,
    hooked_ddp_modules,
    release_node_groups,
    shard_module,
    sync_local_world_size,
)
from lightning_embark.baseline._pipeline import (
    BatchLoss,
    LookaheadLoader,
    lightning_module_under,
    make_train_pipeline,
    plan_under_batch_loss,
    set_pipelined,
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
    check_constraints_within,
    check_sharding_types,
    constraints_from_spec,
    force_sharding_types,
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
    "DENSE_COMPRESSIONS",
    "PARAMETERLESS_TOWER_REASON",
    "AllShardingTypesEBCSharder",
    "BatchLoss",
    "HookedDataParallelWrapper",
    "LookaheadLoader",
    "TorchrecPlanning",
    "TowerCollectionSharder",
    "apply_sparse_optimizer",
    "as_shardable",
    "check_constraints_within",
    "check_dense_compression",
    "check_qcomms_device",
    "check_sharding_types",
    "check_tower_modules",
    "constraints_from_spec",
    "dense_hook",
    "embedding_table_names",
    "force_sharding_types",
    "hooked_ddp_modules",
    "lightning_module_under",
    "make_sharders",
    "make_train_pipeline",
    "merge_constraints",
    "order_towers_by_host",
    "plan_from_torchrec",
    "plan_summary",
    "plan_table_layout",
    "plan_to_torchrec",
    "plan_under_batch_loss",
    "plan_with_torchrec",
    "qcomms_config",
    "release_node_groups",
    "set_pipelined",
    "shard_module",
    "sync_local_world_size",
    "to_torchrec_topology",
    "torchrec_plan",
]
