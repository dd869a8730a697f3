"""What a thread hands to the work it queues for another thread.

Some state is per thread: traffic labels (:mod:`lightning_embark._traffic`), the dispatch
counter's modes and scope (:mod:`lightning_embark.accounting`; torch's dispatch modes are
per thread too). Work queued to a worker thread (the engine's lane and input pipeline, the
dense all-reduce's worker) runs under what was active where it was queued: the queueing
thread calls :func:`capture`, the worker runs the work inside :func:`restored` of it, as
autograd's engine carries a thread's dispatch modes to its own threads.

Traffic labels always travel. Other per-thread state registers a :class:`Carrier`
(:func:`register`) when its module is imported.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any, Protocol

from lightning_embark._traffic import labelled, labels


class Carrier(Protocol):
    """Per-thread state that follows work to another thread."""

    def capture(self) -> Any:
        """This thread's state, as a token (None: nothing to carry)."""

    def restored(self, token: Any) -> AbstractContextManager[Any]:
        """The state of ``token`` active on this thread inside the block."""


class _Labels:
    """Traffic labels (:func:`~lightning_embark._traffic.labels`)."""

    def capture(self) -> Any:
        return labels()

    def restored(self, token: Any) -> AbstractContextManager[Any]:
        return labelled(token)


_CARRIERS: list[Carrier] = [_Labels()]

#: What :func:`capture` returns: each carrier with its token.
Handover = tuple[tuple[Carrier, Any], ...]


def register(carrier: Carrier) -> None:
    """Carry ``carrier``'s state with queued work from now on (once per carrier)."""
    if all(c is not carrier for c in _CARRIERS):
        _CARRIERS.append(carrier)


def capture() -> Handover:
    """This thread's state, for work it queues to another thread."""
    return tuple((carrier, carrier.capture()) for carrier in _CARRIERS)


@contextlib.contextmanager
def restored(handover: Handover) -> Iterator[None]:
    """Run the block under the state :func:`capture` took on the queueing thread."""
    with contextlib.ExitStack() as stack:
        for carrier, token in handover:
            if token is not None:
                stack.enter_context(carrier.restored(token))
        yield
