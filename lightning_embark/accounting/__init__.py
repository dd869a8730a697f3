"""Byte-accurate accounting of collective communication, and what a GPU would see of a step.

:func:`counting_collectives` counts what every ``torch.distributed`` collective call
sends (engine, torchrec and Lightning alike); :class:`CommAccountingCallback` turns
that into per-step records. :class:`DispatchCounter` counts a step's ATen ops, the calls
that would make the host wait for a CUDA device (by call site) and the collective ops,
on every thread the step runs on; :class:`DispatchCountCallback` counts one training
step so, and :func:`format_dispatch` prints it.
"""

from lightning_embark.accounting._callback import CommAccountingCallback, StepRecord
from lightning_embark.accounting._counter import (
    CollectiveStats,
    CommCounter,
    CommSnapshot,
    counting_collectives,
    register_ddp_counting_hook,
)
from lightning_embark.accounting._dispatch import (
    OUTSIDE,
    DispatchCounter,
    DispatchSnapshot,
    SyncSite,
    scope,
)
from lightning_embark.accounting._dispatch_callback import DispatchCountCallback
from lightning_embark.accounting._dispatch_report import format_dispatch
from lightning_embark.accounting._dispatch_scopes import (
    engine_clusters,
    scope_clusters,
    scope_sharded_modules,
)

__all__ = [
    "OUTSIDE",
    "CollectiveStats",
    "CommAccountingCallback",
    "CommCounter",
    "CommSnapshot",
    "DispatchCountCallback",
    "DispatchCounter",
    "DispatchSnapshot",
    "StepRecord",
    "SyncSite",
    "counting_collectives",
    "engine_clusters",
    "format_dispatch",
    "register_ddp_counting_hook",
    "scope",
    "scope_clusters",
    "scope_sharded_modules",
]
