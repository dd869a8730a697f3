"""The torchrec baseline: DMP with torchrec's planner, as Lightning strategies.

``import lightning_embark`` registers ``strategy="torchrec"`` (fp32 comms) and
``strategy="torchrec-fp16"`` (FP16 forward and backward quantized comms, the strong
baseline of DESIGN.md section 6) with Lightning's ``StrategyRegistry``.
"""

from __future__ import annotations

from lightning_embark.baseline.planning import (
    constraints_from_spec,
    plan_summary,
    plan_table_layout,
    plan_with_torchrec,
    resolve_topology,
    to_torchrec_topology,
)
from lightning_embark.baseline.sharders import AllShardingTypesEBCSharder, make_sharders
from lightning_embark.baseline.sharding import apply_sparse_optimizer, shard_module
from lightning_embark.baseline.strategy import TorchrecStrategy

__all__ = [
    "AllShardingTypesEBCSharder",
    "TorchrecStrategy",
    "apply_sparse_optimizer",
    "constraints_from_spec",
    "make_sharders",
    "plan_summary",
    "plan_table_layout",
    "plan_with_torchrec",
    "resolve_topology",
    "shard_module",
    "to_torchrec_topology",
]
