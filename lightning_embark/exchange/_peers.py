"""Turning a collective that failed because of a peer into an error that says so.

When a rank dies, drops its connection or stalls past the process group's timeout,
its peers fail inside whichever collective they were in, with the transport's message
(gloo: "Connection closed by peer", "Timed out"; NCCL: a ``DistBackendError``). That
message names neither the embedding cluster nor the phase, nor what to do.
:func:`peer_failures` re-raises such failures as :class:`PeerError` with both and the
fix, keeping the original as the cause; every other exception passes through untouched.

The embedding exchange is not a step's only collective: DDP broadcasts buffers before
the forward and all-reduces the dense gradients in backward, and Lightning reduces
logged values. :func:`dense_peer_failures` names those (the strategy wraps its steps and
backward in it). A dense-gradient all-reduce that fails inside a Python communication
hook reaches the caller as DDP's cast of the hook's exception to a tensor (``Unable to
cast <transport message> to Tensor``); the cause quoted is the transport message inside.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch.distributed as dist

from lightning_embark.errors import EmbarkError, PeerError
from lightning_embark.exchange._liveness import census, farewell

#: Transport messages of a failed peer (gloo raises plain RuntimeErrors).
PEER_FAILURE_SIGNS = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "Timed out",
    "timed out",
    "Socket Timeout",
    "communicator was aborted",
)


def is_peer_failure(error: BaseException) -> bool:
    """Whether ``error`` is a collective failing because of another rank (not our own bug)."""
    if isinstance(error, EmbarkError) or not isinstance(error, RuntimeError):
        return False
    return isinstance(error, dist.DistError) or any(
        sign in str(error) for sign in PEER_FAILURE_SIGNS
    )


@contextmanager
def peer_failures(rank: int, cluster: str, phase: str) -> Iterator[None]:
    """Re-raise peer failures inside the block as :class:`PeerError` naming rank, cluster and
    phase."""
    with _reraised(rank, f"the {phase} exchange of embedding cluster {cluster!r}"):
        yield


@contextmanager
def dense_peer_failures(rank: int, phase: str) -> Iterator[None]:
    """Re-raise peer failures inside the block as :class:`PeerError` naming rank and phase,
    for the collectives outside the embedding exchange (a :class:`PeerError` already raised
    by :func:`peer_failures` inside passes through as it is)."""
    with _reraised(
        rank,
        f"the {phase} exchange of the dense part (DDP's buffer broadcast and dense-gradient "
        "all-reduce, Lightning's own collectives)",
    ):
        yield


@contextmanager
def named_peer_failures(rank: int, what: str) -> Iterator[None]:
    """Re-raise peer failures inside the block as :class:`PeerError` naming rank and
    ``what`` failed (any other collective: a checkpoint's save, Lightning's barrier)."""
    with _reraised(rank, what):
        yield


#: How DDP reports a Python communication hook's exception (its C++ reducer casts the
#: future's value, the exception object, to a tensor).
_CAST_PREFIX, _CAST_SUFFIX = "Unable to cast ", " to Tensor"


def _transport_message(error: BaseException) -> str:
    """The first line of the transport's message in ``error`` (at most 300 characters),
    without DDP's cast wrapper."""
    text = str(error).strip()
    if text.startswith(_CAST_PREFIX) and text.endswith(_CAST_SUFFIX):
        text = text[len(_CAST_PREFIX) : -len(_CAST_SUFFIX)].strip()
    return (text.splitlines() or [type(error).__name__])[0][:300]


@contextmanager
def _reraised(rank: int, where: str) -> Iterator[None]:
    try:
        yield
    except RuntimeError as error:
        if not is_peer_failure(error):
            raise
        found = census()
        farewell()  # this rank ends too: peers that find it gone must not take it for the cause
        if found.gone:
            names = ", ".join(p.describe() for p in found.gone)
            verb = "is" if len(found.gone) == 1 else "are"
            after = ""
            if found.left:
                left = ", ".join(f"rank {p.rank}" for p in found.left)
                after = f"; {left} ended after it, on a failure of its own"
            raise PeerError(
                f"rank {rank}: {where} failed because {names} {verb} gone: its process ended "
                f"without an error of its own{after} ({_transport_message(error)}). A rank "
                "killed by a signal writes nothing (the kernel's out-of-memory killer sends "
                "SIGKILL; see `dmesg` on its host)",
                gone=tuple(p.rank for p in found.gone),
            ) from error
        raise PeerError(
            f"rank {rank}: {where} failed because another rank is gone or stalled "
            f"({_transport_message(error)}). The first error is in that rank's log; if it is "
            "only slow (a long data load, a checkpoint), raise the process group's timeout, "
            "e.g. EmbarkStrategy(timeout=datetime.timedelta(hours=1))"
        ) from error


def stopped_by(error: BaseException) -> BaseException | None:
    """The error every later job of a worker gets instead of running, when ``error`` is a
    collective that failed because of a peer (None: later jobs run).

    A job that failed that way may have left its other collectives unissued, and peers may
    have issued theirs: gloo numbers a group's collectives in the order each rank issues
    them, so a later collective of this rank would meet a peer's earlier one under the same
    number, and gloo aborts the process when their sizes differ ("Received data size
    doesn't match expected size"). No later job may issue one; the rank is going down.
    """
    if not is_peer_failure(error) and not isinstance(error, PeerError):
        return None
    stopped = RuntimeError(
        f"not run: an earlier collective on this worker failed because of a peer ({error})"
    )
    stopped.__cause__ = error
    return stopped
