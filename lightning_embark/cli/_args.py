"""Argument types the commands share, so that one flag parses the same everywhere."""

from __future__ import annotations

import argparse


def rate_mbit(text: str) -> float | None:
    """``--rate-mbit``: a link rate in Mbit/s, or ``none``/``unshaped`` for an unshaped link.

    Raises:
        argparse.ArgumentTypeError: ``text`` is neither a number nor one of the two words
            (argparse turns it into a usage error naming the flag).
    """
    if text.lower() in ("none", "unshaped"):
        return None
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected Mbit/s as a number or 'none', got {text!r}"
        ) from None
