"""Process trees and signals: stopping a job completely, and cleanup that always runs.

torchrun starts its workers in sessions of their own, so neither a process group
kill nor torchrun's own death reaches them reliably; they are found through
``/proc`` instead. SIGTERM is turned into an exception while a cluster is in use,
so ``finally`` blocks (and with them the namespace teardown) run on ``kill`` too.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence

KILL_GRACE_S = 5.0
_POLL_S = 0.05
_PR_SET_PDEATHSIG = 1


def parent_death_signal_setter() -> Callable[[], None] | None:
    """A preexec function: if the supervisor dies without cleaning up (SIGKILL),
    torchrun gets SIGTERM and stops its workers instead of running on forever.

    prctl is looked up here, in the parent: the child between fork and exec must
    not load libraries or take locks.
    """
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    sigterm = int(signal.SIGTERM)

    def _set() -> None:
        prctl(_PR_SET_PDEATHSIG, sigterm, 0, 0, 0)

    return _set


def _descendants(pid: int) -> set[int]:
    """All live descendants of ``pid``, from ``/proc`` (Linux)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(b")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _signal_pids(pids: set[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting to be reaped counts as dead)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return False
    return stat[stat.rindex(b")") + 2 : stat.rindex(b")") + 3] not in (b"Z", b"X")


def terminate_trees(procs: Sequence[subprocess.Popen], *, grace_s: float = KILL_GRACE_S) -> None:
    """Stop every process in ``procs`` with its process group and all its descendants.

    All trees get SIGTERM at once (so torchrun can stop its workers cleanly and
    the hosts stop in parallel); whatever is still alive after ``grace_s`` gets
    SIGKILL.
    """
    procs = [proc for proc in procs if proc.poll() is None]
    tree: set[int] = set()
    for proc in procs:
        tree |= _descendants(proc.pid)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
    _signal_pids(tree, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        for proc in procs:
            if proc.poll() is None:
                tree |= _descendants(proc.pid)
        tree = {pid for pid in tree if _alive(pid)}
        if not tree and all(proc.poll() is not None for proc in procs):
            return
        time.sleep(_POLL_S)
    for proc in procs:
        if proc.poll() is None:
            tree |= _descendants(proc.pid)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
    _signal_pids(tree, signal.SIGKILL)
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace_s)


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """Turn SIGTERM into ``SystemExit(143)`` for the duration, so cleanup runs.

    Only in the main thread, and only where SIGTERM still has its default action:
    a handler installed by someone else (Lightning, a scheduler) is left alone.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)
    if previous is not signal.SIG_DFL:
        yield
        return

    def _raise(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Ignore SIGINT and SIGTERM during teardown, so a second Ctrl-C cannot cut it short."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig in saved:
        signal.signal(sig, signal.SIG_IGN)
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
