"""The sharding plan: what every layer speaks (planners write it, the engine executes it).

A :class:`Plan` is embedding clusters (:class:`ClusterPlan`), every table's 3D
layout (:class:`TableLayout`) and towers (:class:`TowerPlan`: tables kept on one host,
DMT; :class:`TowerChoice`: why, when the planner chose them), as versioned JSON;
:func:`host_plan` is what one host's ranks run for its towers and :func:`restrict` a
plan cut down to one collection's tables. :mod:`.layouts` builds the common
layouts by hand, :mod:`.names` matches a model's tables to a plan's, :mod:`.summary`
prints a plan. Nothing here imports torch, torchrec or the engine.
"""

from lightning_embark.plan import layouts, names
from lightning_embark.plan._cache import (
    CACHE_INDEX_BYTES,
    CACHE_SLOT_BYTES,
    hbm_block_bytes,
    is_cached,
)
from lightning_embark.plan._host import host_plan, restrict
from lightning_embark.plan._kinds import ClusterType, Compression, RowSplit
from lightning_embark.plan._summary import plan_summary, tower_line
from lightning_embark.plan._tower_choice import TowerCandidate, TowerChoice
from lightning_embark.plan._tower_file import (
    load_towers,
    save_towers,
    towers_from_dict,
    towers_to_dict,
)
from lightning_embark.plan._tower_requests import TowerRequest
from lightning_embark.plan._towers import TowerModule, TowerPlan, dot_pairs
from lightning_embark.plan._types import PLAN_VERSION, ClusterPlan, Plan, TableLayout

__all__ = [
    "CACHE_INDEX_BYTES",
    "CACHE_SLOT_BYTES",
    "PLAN_VERSION",
    "ClusterPlan",
    "ClusterType",
    "Compression",
    "Plan",
    "RowSplit",
    "TableLayout",
    "TowerCandidate",
    "TowerChoice",
    "TowerModule",
    "TowerPlan",
    "TowerRequest",
    "dot_pairs",
    "hbm_block_bytes",
    "host_plan",
    "is_cached",
    "layouts",
    "load_towers",
    "names",
    "plan_summary",
    "restrict",
    "save_towers",
    "tower_line",
    "towers_from_dict",
    "towers_to_dict",
]
