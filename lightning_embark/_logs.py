"""Quieting known-harmless third-party log records, one filter per message, at the call.

Each filter names the library, the message and why it is harmless here, and is
installed only around the call that produces it, never globally.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager


class _DropPrefix(logging.Filter):
    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.prefix)


@contextmanager
def dropped(logger: logging.Logger, prefix: str) -> Iterator[None]:
    """Drop ``logger``'s own records whose message starts with ``prefix`` inside the block."""
    drop = _DropPrefix(prefix)
    logger.addFilter(drop)
    try:
        yield
    finally:
        logger.removeFilter(drop)


@contextmanager
def quiet_torchrec_planner() -> Iterator[None]:
    """torchrec's planner logs ``Sharding spec not found for <table>`` on the *root*
    logger once per data-parallel table: such tables have no sharding spec by design."""
    with dropped(logging.getLogger(), "Sharding spec not found for "):
        yield
