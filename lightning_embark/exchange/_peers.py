"""Turning a collective that failed because of a peer into an error that says so.

When a rank dies, drops its connection or stalls past the process group's timeout,
its peers fail inside whichever collective they were in, with the transport's message
(gloo: "Connection closed by peer", "Timed out"; NCCL: a ``DistBackendError``). That
message names neither the embedding cluster nor the phase, nor what to do.
:func:`peer_failures` re-raises such failures as :class:`PeerError` with both and the
fix, keeping the original as the cause; every other exception passes through untouched.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch.distributed as dist

from lightning_embark.errors import EmbarkError, PeerError

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
    try:
        yield
    except RuntimeError as error:
        if not is_peer_failure(error):
            raise
        cause = (str(error).strip().splitlines() or [type(error).__name__])[0][:300]
        raise PeerError(
            f"rank {rank}: the {phase} exchange of embedding cluster {cluster!r} failed because "
            f"another rank is gone or stalled ({cause}). The first error is in that rank's log; "
            "if it is only slow (a long data load, a checkpoint), raise the process group's "
            "timeout, e.g. EmbarkStrategy(timeout=datetime.timedelta(hours=1))"
        ) from error
