"""Traffic labels: which part of a step a collective belongs to, for whoever counts bytes.

The byte counter (:mod:`lightning_embark.accounting`) sees every ``torch.distributed``
call but not what it is for: a tower's ID exchange and a flat cluster's lookup are both
``all_to_all_single``. Code that issues a collective for a distinct part of the step
wraps it in :func:`traffic`; the counter reads :func:`current_traffic` at the call and
keeps per-label totals beside the per-collective ones.

Labels in use: ``towers:ids``, ``towers:outputs`` (forward outputs and their backward
gradients), ``towers:modules`` (tower-module gradients inside a host), ``dense`` (the
dense model's gradient all-reduce), ``metrics`` (reductions of logged figures, such as
the global-batch ``train_loss``) and :data:`AHEAD` (embedding IDs the input pipeline sends
on its own thread while a step computes: embedding bytes, but no step waits in them).
Unlabelled traffic is the embedding clusters'.

Labels are per thread: the dense all-reduce runs on a background worker while the
training thread issues the embedding exchanges, and each must see only its own label.
A label wraps the calls it names and nothing longer (autograd may run a backward on
another thread, where a label set around ``loss.backward()`` would not be seen). Work
handed to another thread takes its labels along (:func:`labels`, :func:`labelled`), as the
engine's collective lane does.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

_local = threading.local()

#: The input pipeline's traffic (:mod:`lightning_embark.engine._pipeline`).
AHEAD = "embedding:ahead"


def under_ahead(label: str) -> str:
    """``label`` for a collective the input pipeline issues: still ahead traffic
    (:func:`is_ahead`), with ``label`` kept after the slash."""
    return f"{AHEAD}/{label}"


def is_ahead(label: str | None) -> bool:
    """Whether ``label`` is the input pipeline's traffic, alone or with a label under it."""
    return label is not None and (label == AHEAD or label.startswith(AHEAD + "/"))


def _stack() -> list[str]:
    stack: list[str] | None = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    return stack


@contextlib.contextmanager
def traffic(label: str) -> Iterator[None]:
    """Tag the collectives issued inside the block with ``label`` (innermost wins)."""
    stack = _stack()
    stack.append(label)
    try:
        yield
    finally:
        stack.pop()


def labels() -> tuple[str, ...]:
    """This thread's active labels, outermost first (for work handed to another thread)."""
    return tuple(_stack())


@contextlib.contextmanager
def labelled(active: tuple[str, ...]) -> Iterator[None]:
    """Run the block under ``active`` (from :func:`labels` on another thread) on top of
    this thread's own labels."""
    stack = _stack()
    depth = len(stack)
    stack.extend(active)
    try:
        yield
    finally:
        del stack[depth:]


def current_traffic() -> str | None:
    """The innermost active label, or None (embedding-cluster traffic)."""
    stack = _stack()
    return stack[-1] if stack else None
