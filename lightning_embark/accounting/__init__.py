"""Byte-accurate accounting of collective communication, split by link class.

:func:`counting_collectives` counts what every ``torch.distributed`` collective call
sends (engine, torchrec and Lightning alike); :class:`CommAccountingCallback` turns
that into per-step records.
"""

from lightning_embark.accounting._callback import CommAccountingCallback, StepRecord
from lightning_embark.accounting._counter import (
    CollectiveStats,
    CommCounter,
    CommSnapshot,
    counting_collectives,
    register_ddp_counting_hook,
)

__all__ = [
    "CollectiveStats",
    "CommAccountingCallback",
    "CommCounter",
    "CommSnapshot",
    "StepRecord",
    "counting_collectives",
    "register_ddp_counting_hook",
]
