"""What a GPU would see of a step: ATen ops dispatched, host syncs by call site, collectives.

On an H100 a step's kernels take microseconds; what the host spends issuing them, and every
point where it waits for the device, is what remains. :class:`DispatchCounter` counts both
on any machine, a CPU included:

* every ATen op dispatched (a :class:`~torch.utils._python_dispatch.TorchDispatchMode`),
  by thread, by scope (an embedding cluster and direction, :mod:`._dispatch_scopes`) and
  by call site;
* the calls that would make the host wait for a CUDA device
  (:func:`~._sync_ops.sync_reason`, decided by op since on a CPU every tensor is a host
  tensor), each attributed to its call site: the innermost frame of the Python stack at
  dispatch time outside torch and the standard library (in ``lightning_embark``, its
  kernels, torchrec, fbgemm, Lightning...: :mod:`._call_sites`), with the thread and scope
  it ran in; reads of third-party host tensors by design
  (:data:`~._call_sites.KNOWN_HOST_READS`) count as host work. Host
  reads no ATen op shows on a CPU (``tolist``, ``numpy``, ``cpu``,
  ``torch.tensor(data, device=...)``) are counted at the Python call; calls inside
  :func:`~lightning_embark._host_work.host_work` are reported apart, as host work;
* the collective ops (``c10d``), by scope. The per-call byte counts stay with
  :mod:`._counter`, which the callers run beside this one.

Threads: dispatch modes are per thread, and the engine issues work on worker threads (its
lane, its input pipeline, the dense all-reduce's worker). The counter follows work to them
through :mod:`lightning_embark._handover`: work queued while a thread counts is counted on
the worker that runs it, whenever it runs, under the scope it was queued in, so a step's
count holds everything the step queued (the backward's updates that run past it, the next
batch's input distribution). Autograd's engine carries dispatch modes into backward itself
(and to its device threads on CUDA, where :func:`active_counter` finds the counter from its
mode). Ops that Triton's interpreter dispatches inside a kernel launch on a CPU are counted
apart (``interpreted_kernel_ops``): a compiled launch
dispatches none.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack

from lightning_embark._handover import register
from lightning_embark._host_work import in_host_work
from lightning_embark.accounting._call_sites import call_site, known_host_read
from lightning_embark.accounting._sync_ops import (
    DEVICE_TO_HOST,
    HOST_READS,
    HOST_TO_DEVICE,
    HOST_WRITES,
    sync_reason,
)

#: The scope of work outside every scoped call (see :mod:`._dispatch_scopes`).
OUTSIDE = "(step)"
#: Op namespaces of collectives (``dist.*`` calls dispatch them).
COLLECTIVE_NAMESPACES = ("c10d", "_c10d_functional")

_state = threading.local()


def current_scope() -> str:
    """This thread's innermost scope (:data:`OUTSIDE` when none)."""
    stack: list[str] = getattr(_state, "scopes", [])
    return stack[-1] if stack else OUTSIDE


@contextlib.contextmanager
def scope(name: str) -> Iterator[None]:
    """Count this thread's ops and syncs inside the block under ``name``."""
    stack: list[str] | None = getattr(_state, "scopes", None)
    if stack is None:
        stack = _state.scopes = []
    stack.append(name)
    try:
        yield
    finally:
        stack.pop()


@dataclass(frozen=True, kw_only=True)
class SyncSite:
    """Where a would-be sync happened, and what it was."""

    op: str
    reason: str
    site: str
    scope: str
    thread: str
    host_work: bool


@dataclass(kw_only=True)
class DispatchSnapshot:
    """One interval's counts (usually one training step) on one rank.

    Attributes:
        ops: ATen ops dispatched, per ``(scope, thread, site)``.
        syncs: Would-be syncs, each with how often it happened.
        collectives: Collective ops, per ``(scope, op)``.
        interpreted_kernel_ops: Ops Triton's interpreter dispatched inside kernel launches.
    """

    ops: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    syncs: Counter[SyncSite] = field(default_factory=Counter)
    collectives: Counter[tuple[str, str]] = field(default_factory=Counter)
    interpreted_kernel_ops: int = 0

    @property
    def total_ops(self) -> int:
        return sum(self.ops.values())

    @property
    def device_syncs(self) -> int:
        """Would-be syncs outside host work: what would stall a GPU's stream."""
        return sum(n for s, n in self.syncs.items() if not s.host_work)

    def ops_by(self, what: str) -> dict[str, int]:
        """Ops per ``scope``, ``thread`` or ``site``."""
        index = ("scope", "thread", "site").index(what)
        out: Counter[str] = Counter()
        for key, n in self.ops.items():
            out[key[index]] += n
        return dict(out)

    def syncs_by_scope(self, *, host_work: bool = False) -> dict[str, int]:
        """Would-be syncs per scope (host work's, with ``host_work``)."""
        out: Counter[str] = Counter()
        for s, n in self.syncs.items():
            if s.host_work == host_work:
                out[s.scope] += n
        return dict(out)

    def collectives_by_scope(self) -> dict[str, int]:
        out: Counter[str] = Counter()
        for (where, _), n in self.collectives.items():
            out[where] += n
        return dict(out)

    def to_dict(self) -> dict[str, Any]:
        """The snapshot as JSON-ready data (:meth:`from_dict` reads it back)."""
        return {
            "ops": [[*key, n] for key, n in sorted(self.ops.items())],
            "syncs": [
                {**vars(s), "count": n}
                for s, n in sorted(self.syncs.items(), key=lambda kv: (-kv[1], kv[0].site))
            ],
            "collectives": [[*key, n] for key, n in sorted(self.collectives.items())],
            "interpreted_kernel_ops": self.interpreted_kernel_ops,
        }

    @staticmethod
    def from_dict(data: dict[str, Any]) -> DispatchSnapshot:
        syncs: Counter[SyncSite] = Counter()
        for row in data["syncs"]:
            fields = dict(row)
            syncs[SyncSite(**{k: v for k, v in fields.items() if k != "count"})] = fields["count"]
        return DispatchSnapshot(
            ops=Counter({(s, t, c): n for s, t, c, n in data["ops"]}),
            syncs=syncs,
            collectives=Counter({(s, o): n for s, o, n in data["collectives"]}),
            interpreted_kernel_ops=data["interpreted_kernel_ops"],
        )


class DispatchCounter:
    """Counts ATen ops, would-be host syncs and collective ops of the threads that count.

    ``with counter.counting():`` counts this thread inside the block, and the work it
    queues to the engine's worker threads wherever and whenever that runs; read the
    totals with :meth:`snapshot` once that work is done (e.g. after the engine's next
    lookup, or ``close()``). Safe to use from several threads at once.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = DispatchSnapshot()

    @contextlib.contextmanager
    def counting(self) -> Iterator[DispatchCounter]:
        """Count this thread's dispatches inside the block (one counter per thread at a
        time)."""
        if getattr(_state, "counter", None) is not None:
            raise RuntimeError("a DispatchCounter is already counting on this thread")
        _state.counter = self
        _PATCHES.acquire()
        try:
            with _OpMode(self):
                yield self
        finally:
            _state.counter = None
            _PATCHES.release()

    def snapshot(self) -> DispatchSnapshot:
        """A copy of the counts so far."""
        with self._lock:
            c = self._counts
            return DispatchSnapshot(
                ops=Counter(c.ops),
                syncs=Counter(c.syncs),
                collectives=Counter(c.collectives),
                interpreted_kernel_ops=c.interpreted_kernel_ops,
            )

    def reset(self) -> DispatchSnapshot:
        """The counts so far, and start from zero."""
        with self._lock:
            counts, self._counts = self._counts, DispatchSnapshot()
        return counts

    def record_op(self, func: Any, args: Any, kwargs: dict[str, Any]) -> None:
        """Count one dispatched op (the mode's hook)."""
        site, in_kernel, inner = call_site()
        if in_kernel:
            with self._lock:
                self._counts.interpreted_kernel_ops += 1
            return
        where, thread = current_scope(), threading.current_thread().name
        namespace = func.namespace
        reason = sync_reason(func, args, kwargs) if namespace == "aten" else None
        with self._lock:
            self._counts.ops[(where, thread, site)] += 1
            if namespace in COLLECTIVE_NAMESPACES:
                self._counts.collectives[(where, func._schema.name)] += 1
            if reason is not None:
                self._count_sync(str(func), reason, site, where, thread, inner)

    def record_host_call(self, name: str, reason: str) -> None:
        """Count one host read or write made at the Python level (see :data:`_PATCHES`)."""
        site, _, inner = call_site()
        where, thread = current_scope(), threading.current_thread().name
        with self._lock:
            self._count_sync(name, reason, site, where, thread, inner)

    def _count_sync(
        self, op: str, reason: str, site: str, where: str, thread: str, inner: tuple[str, int]
    ) -> None:
        host = in_host_work() or known_host_read(inner)
        key = SyncSite(op=op, reason=reason, site=site, scope=where, thread=thread, host_work=host)
        self._counts.syncs[key] += 1


def active_counter() -> DispatchCounter | None:
    """The counter this thread counts for: the one it entered, else the one whose mode
    autograd's engine carried to it (its CUDA device threads run backward with the
    dispatch modes of the thread that started it, not its Python thread-locals)."""
    counter: DispatchCounter | None = getattr(_state, "counter", None)
    if counter is not None:
        return counter
    for mode in _get_current_dispatch_mode_stack():
        if isinstance(mode, _OpMode):
            return mode.counter
    return None


class _OpMode(TorchDispatchMode):
    """Hands every op dispatched on this thread to the counter, then runs it."""

    def __init__(self, counter: DispatchCounter) -> None:
        super().__init__()
        self.counter = counter

    def __torch_dispatch__(
        self, func: Any, types: Any, args: Any = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        self.counter.record_op(func, args, kwargs)
        return func(*args, **kwargs)


# ----------------------------------------------------------------- host calls
class _Patches:
    """Wrappers over the host reads and writes no ATen op shows on a CPU
    (:data:`~._sync_ops.HOST_READS`, :data:`~._sync_ops.HOST_WRITES`), installed while any
    thread counts; each counts for the calling thread's counter only."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users = 0
        self._saved: list[tuple[Any, str, Any]] = []

    def acquire(self) -> None:
        with self._lock:
            self._users += 1
            if self._users == 1:
                for name in HOST_READS:
                    self._install(torch.Tensor, name, _read(name, getattr(torch.Tensor, name)))
                for name in HOST_WRITES:
                    self._install(torch, name, _write(name, getattr(torch, name)))

    def release(self) -> None:
        with self._lock:
            self._users -= 1
            if self._users == 0:
                for owner, name, saved in reversed(self._saved):
                    if saved is None:
                        delattr(owner, name)
                    else:
                        setattr(owner, name, saved)
                self._saved = []

    def _install(self, owner: Any, name: str, wrapper: Callable[..., Any]) -> None:
        self._saved.append((owner, name, vars(owner).get(name)))
        setattr(owner, name, wrapper)


def _read(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def read(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        counter = active_counter()
        if counter is not None:
            counter.record_host_call(f"Tensor.{name}", DEVICE_TO_HOST)
        return original(self, *args, **kwargs)

    return read


def _write(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def write(data: Any, *args: Any, **kwargs: Any) -> Any:
        counter = active_counter()
        device = kwargs.get("device", args[1] if name == "as_tensor" and len(args) > 1 else None)
        if counter is not None and device is not None and not isinstance(data, torch.Tensor):
            counter.record_host_call(f"torch.{name}", HOST_TO_DEVICE)
        return original(data, *args, **kwargs)

    return write


_PATCHES = _Patches()


# ----------------------------------------------------------------- threads
class _Carrier:
    """Carries a counting thread's counter and scope to the work it queues
    (:mod:`lightning_embark._handover`)."""

    def capture(self) -> Any:
        counter = active_counter()
        return None if counter is None else (counter, current_scope())

    def restored(self, token: Any) -> AbstractContextManager[Any]:
        counter, where = token
        stack = contextlib.ExitStack()
        if active_counter() is None:  # a worker already counting keeps its own
            stack.enter_context(counter.counting())
        stack.enter_context(scope(where))
        return stack


register(_Carrier())
