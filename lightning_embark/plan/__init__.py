"""The sharding plan: what every layer speaks (planners write it, the engine executes it).

A :class:`Plan` is embedding clusters (:class:`ClusterPlan`) plus every table's 3D
layout (:class:`TableLayout`), as versioned JSON. :mod:`.layouts` builds the common
layouts by hand, :mod:`.names` matches a model's tables to a plan's, :mod:`.summary`
prints a plan. Nothing here imports torch, torchrec or the engine.
"""

from lightning_embark.plan import layouts, names
from lightning_embark.plan._summary import plan_summary
from lightning_embark.plan._types import (
    PLAN_VERSION,
    ClusterPlan,
    ClusterType,
    Compression,
    Plan,
    RowSplit,
    TableLayout,
)

__all__ = [
    "PLAN_VERSION",
    "ClusterPlan",
    "ClusterType",
    "Compression",
    "Plan",
    "RowSplit",
    "TableLayout",
    "layouts",
    "names",
    "plan_summary",
]
