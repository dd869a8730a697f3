"""Which peer is gone: every rank's liveness socket, probed when a collective fails.

A rank that dies (``kill -9``, the kernel's out-of-memory killer, a crash in native code)
leaves its peers with the transport's message, ``Connection closed by peer
[10.77.0.2]:41234``: an address and an ephemeral port, no rank. So every rank opens one
listening TCP socket, and the ranks swap their addresses once, at the same point of their
setup (:func:`start_liveness`: one ``all_gather_object`` over the default group). The
socket is never accepted from: the kernel completes a connection to a listening socket by
itself, so a rank busy in a step (or stuck in a collective) answers a probe as a waiting
one does, and when its process ends the kernel closes the socket and refuses the next
probe. :func:`census` probes every peer: a refused (or unanswered) connection is a rank
that is gone. A rank that ends because a peer failed says so first (:func:`farewell`: a
line on every peer's socket), so that a survivor that finds it gone later, when it meets
the failure itself, names the rank that died and not the ones that left after it.

One socket per process, made once per default group: a process that builds model after
model reuses it, and a new default group (after ``destroy_process_group``) makes a new one.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any

import torch.distributed as dist

#: How long a probe waits for a peer that neither answers nor refuses (a host that is
#: unreachable); a live or dead process answers at once.
PROBE_TIMEOUT_S = 1.0
#: Probe rounds when every peer answers, and the pause between them. A process's file
#: descriptors close one by one as it ends: its connections can reset (the failure that
#: made this rank probe) a moment before its liveness socket closes.
PROBE_ROUNDS, PROBE_AGAIN_S = 3, 0.2


@dataclass(frozen=True, kw_only=True)
class Peer:
    """Where one rank listens, and which host it is on."""

    rank: int
    host: int
    hostname: str
    address: str
    port: int

    def describe(self) -> str:
        """``rank 1 on host 0 (node-a, 10.77.0.1)``."""
        return f"rank {self.rank} on host {self.host} ({self.hostname}, {self.address})"


@dataclass(kw_only=True)
class _Liveness:
    group: Any  # the default group these peers were gathered on
    listener: socket.socket
    peers: list[Peer]
    farewells: set[int] = field(default_factory=set)  # ranks that said they end
    said_farewell: bool = False


_STATE: _Liveness | None = None


def _own_address() -> str:
    """The address this rank reaches its peers from: the source address of a route to
    ``MASTER_ADDR`` (on the emulated cluster, the host's own address on the inter-host
    link), else the host name's."""
    master = os.environ.get("MASTER_ADDR")
    if master:
        with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((master, 9))  # a datagram socket sends nothing on connect
            return str(s.getsockname()[0])
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def start_liveness(ranks_per_host: int) -> None:
    """Open this rank's liveness socket and learn every peer's (collective over the default
    group: every rank calls it at the same point; once per default group, later calls
    return at once on every rank).

    Args:
        ranks_per_host: Ranks per host (rank ``r`` is on host ``r // ranks_per_host``).
    """
    global _STATE
    world = dist.group.WORLD
    if _STATE is not None and _STATE.group is world:
        return
    if _STATE is not None:
        _STATE.listener.close()
        _STATE = None
    address = _own_address()
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.bind((address, 0))
    except OSError:  # not an address of this host after all: listen on every interface
        listener.bind(("", 0))
    listener.listen(64)
    mine = (socket.gethostname(), address, listener.getsockname()[1])
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    peers = [
        Peer(rank=r, host=r // ranks_per_host, hostname=h, address=a, port=p)
        for r, (h, a, p) in enumerate(gathered)
    ]
    _STATE = _Liveness(group=world, listener=listener, peers=peers)


@dataclass(frozen=True, kw_only=True)
class Census:
    """The peers that are not there any more, as :func:`census` found them.

    Attributes:
        gone: Peers whose process ended without a word: killed, or crashed.
        left: Peers that ended after a failure of their own, saying so first
            (:func:`farewell`): not the cause.
    """

    gone: tuple[Peer, ...] = ()
    left: tuple[Peer, ...] = ()


def _current() -> _Liveness | None:
    """The liveness state of the current default group (None when there is none, or the
    state is an earlier group's: a process that trained, tore its group down and goes on)."""
    state = _STATE
    if state is None or not dist.is_initialized() or state.group is not dist.group.WORLD:
        return None
    return state


def census() -> Census:
    """Probe every peer's liveness socket (see the module docstring) and read the farewells
    that peers which ended after a failure left on this rank's; empty when
    :func:`start_liveness` did not run under the current default group."""
    state = _current()
    if state is None:
        return Census()
    me = dist.get_rank()
    absent: list[Peer] = []
    for attempt in range(PROBE_ROUNDS):
        if attempt:
            time.sleep(PROBE_AGAIN_S)
        absent = [p for p in state.peers if p.rank != me and not _answers(p)]
        if absent:
            break
    state.farewells |= _read_farewells(state.listener)
    return Census(
        gone=tuple(p for p in absent if p.rank not in state.farewells),
        left=tuple(p for p in absent if p.rank in state.farewells),
    )


def _answers(peer: Peer) -> bool:
    """Whether ``peer``'s liveness socket takes a connection (its process is there)."""
    try:
        with socket.create_connection((peer.address, peer.port), timeout=PROBE_TIMEOUT_S):
            return True
    except OSError:
        return False


def farewell() -> None:
    """Tell every peer still there that this rank ends after a failure (once per process):
    a line on its liveness socket, which its :func:`census` reads, so that a peer that
    finds this rank gone later does not take it for the cause."""
    state = _current()
    if state is None or state.said_farewell:
        return
    state.said_farewell = True
    me = dist.get_rank()
    for peer in state.peers:
        if peer.rank == me:
            continue
        with (
            contextlib.suppress(OSError),
            socket.create_connection((peer.address, peer.port), timeout=PROBE_TIMEOUT_S) as s,
        ):
            s.sendall(f"{_FAREWELL} {me}\n".encode())


#: The first word of a farewell line.
_FAREWELL = "embark-farewell"


def _read_farewells(listener: socket.socket) -> set[int]:
    """The ranks whose farewell waits on ``listener`` (probes leave empty connections)."""
    ranks = set()
    listener.setblocking(False)
    try:
        while True:
            try:
                connection, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                break
            with connection:
                connection.settimeout(0.2)
                with contextlib.suppress(OSError):
                    words = connection.recv(256).decode(errors="replace").split()
                    if len(words) == 2 and words[0] == _FAREWELL and words[1].isdigit():
                        ranks.add(int(words[1]))
    finally:
        listener.setblocking(True)
    return ranks
