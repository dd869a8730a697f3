"""Byte-accurate accounting of collective communication, split by link class."""

from lightning_embark.comm.accounting import (
    CollectiveStats,
    CommCounter,
    CommSnapshot,
    counting_collectives,
    register_ddp_counting_hook,
)
from lightning_embark.comm.callback import CommAccountingCallback, StepRecord
from lightning_embark.comm.volume import table_wise_pooled_all_to_all_bytes

__all__ = [
    "CollectiveStats",
    "CommAccountingCallback",
    "CommCounter",
    "CommSnapshot",
    "counting_collectives",
    "register_ddp_counting_hook",
    "StepRecord",
    "table_wise_pooled_all_to_all_bytes",
]
