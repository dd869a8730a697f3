"""Progress lines of the headline suite, on stderr: stdout carries the markdown tables."""

from __future__ import annotations

import sys


def log(message: str) -> None:
    """Progress on stderr (stdout carries the tables)."""
    print(f"[headline] {message}", file=sys.stderr, flush=True)
