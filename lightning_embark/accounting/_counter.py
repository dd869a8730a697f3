"""Counting every collective's bytes, split intra-host / inter-host and by collective.

:func:`counting_collectives` wraps the ``torch.distributed`` collectives that the
project, torchrec and Lightning call through the module (``dist.all_to_all_single``
and friends), so one counter sees the baseline and our engine alike. DDP's gradient
all-reduce happens inside C++ and is counted through a DDP communication hook
(:func:`register_ddp_counting_hook`). Each record is what *this* rank sends; the
rank-to-host map decides whether a peer is on the same host.

The time a rank is blocked in a collective (a synchronous call, or ``wait()`` on
an asynchronous one) is recorded too: it is the exposed communication time that
the benchmark reports as the share of a step spent communicating.

Calls made under a traffic label (:func:`lightning_embark._traffic.traffic`: the
towers' ID and output exchanges, the dense gradients) are also totalled per label
(``by_traffic``), so a report can say which part of a step crossed hosts.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

import lightning_embark.accounting._sends as sends
from lightning_embark._traffic import current_traffic, traffic

_COLLECTIVES = (
    "all_to_all_single",
    "all_to_all",
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_single",  # torch >= 2.13's name of all_gather_into_tensor
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce_scatter_single",  # torch >= 2.13's name of reduce_scatter_tensor
    "broadcast",
)


@dataclass(kw_only=True)
class CollectiveStats:
    """Totals for one collective kind."""

    calls: int = 0
    intra_host_bytes: int = 0
    inter_host_bytes: int = 0
    blocked_seconds: float = 0.0

    def to_dict(self) -> dict[str, float | int]:
        return {
            "calls": self.calls,
            "intra_host": self.intra_host_bytes,
            "inter_host": self.inter_host_bytes,
            "blocked_seconds": self.blocked_seconds,
        }


@dataclass(kw_only=True)
class CommSnapshot:
    """What one rank sent over an interval (usually one training step)."""

    by_collective: dict[str, CollectiveStats] = field(default_factory=dict)
    by_traffic: dict[str, CollectiveStats] = field(default_factory=dict)

    @property
    def intra_host_bytes(self) -> int:
        return sum(s.intra_host_bytes for s in self.by_collective.values())

    @property
    def inter_host_bytes(self) -> int:
        return sum(s.inter_host_bytes for s in self.by_collective.values())

    @property
    def blocked_seconds(self) -> float:
        return sum(s.blocked_seconds for s in self.by_collective.values())

    def blocked_seconds_in(self, *names: str) -> float:
        """Blocked time in the named collectives only."""
        return sum(s.blocked_seconds for n, s in self.by_collective.items() if n in names)

    def to_dict(self) -> dict[str, Any]:
        return {
            "intra_host": self.intra_host_bytes,
            "inter_host": self.inter_host_bytes,
            "by_collective": {n: s.to_dict() for n, s in sorted(self.by_collective.items())},
            "by_traffic": {n: s.to_dict() for n, s in sorted(self.by_traffic.items())},
        }


@dataclass(frozen=True, kw_only=True)
class CallRecord:
    """One counted call, kept when the counter is asked to (tests, debugging)."""

    name: str
    dtype: torch.dtype | None
    sends: dict[int, int]
    traffic: str | None = None


class CommCounter:
    """Accumulates bytes per collective for one rank, given the rank-to-host map.

    Args:
        rank: This process's global rank.
        ranks_per_host: Ranks per host; rank r is on host ``r // ranks_per_host``.
    """

    def __init__(self, *, rank: int, ranks_per_host: int, keep_calls: bool = False) -> None:
        if ranks_per_host < 1:
            raise ValueError(f"ranks_per_host must be >= 1, got {ranks_per_host}")
        self.rank = rank
        self.ranks_per_host = ranks_per_host
        self.keep_calls = keep_calls
        self.calls: list[CallRecord] = []
        self._lock = threading.Lock()
        self._stats: dict[str, CollectiveStats] = defaultdict(CollectiveStats)
        self._traffic: dict[str, CollectiveStats] = defaultdict(CollectiveStats)

    def host_of(self, rank: int) -> int:
        return rank // self.ranks_per_host

    def record(
        self,
        name: str,
        sends_by_global_rank: dict[int, int],
        dtype: torch.dtype | None = None,
        *,
        traffic: str | None = None,
    ) -> None:
        """Add one call that sent ``bytes`` to each global rank in the map (and to the
        totals of its traffic label, if any)."""
        with self._lock:
            if self.keep_calls:
                self.calls.append(
                    CallRecord(
                        name=name, dtype=dtype, sends=dict(sends_by_global_rank), traffic=traffic
                    )
                )
            totals = [self._stats[name]]
            if traffic is not None:
                totals.append(self._traffic[traffic])
            my_host = self.host_of(self.rank)
            for stats in totals:
                stats.calls += 1
                for peer, num_bytes in sends_by_global_rank.items():
                    if peer == self.rank or num_bytes == 0:
                        continue
                    if self.host_of(peer) == my_host:
                        stats.intra_host_bytes += num_bytes
                    else:
                        stats.inter_host_bytes += num_bytes

    def add_blocked(self, name: str, seconds: float, *, traffic: str | None = None) -> None:
        with self._lock:
            self._stats[name].blocked_seconds += seconds
            if traffic is not None:
                self._traffic[traffic].blocked_seconds += seconds

    def snapshot(self) -> CommSnapshot:
        """A copy of the totals so far."""
        with self._lock:
            return CommSnapshot(
                by_collective={n: CollectiveStats(**vars(s)) for n, s in self._stats.items()},
                by_traffic={n: CollectiveStats(**vars(s)) for n, s in self._traffic.items()},
            )

    def reset(self) -> CommSnapshot:
        """Return the totals so far and start counting from zero."""
        with self._lock:
            stats, self._stats = self._stats, defaultdict(CollectiveStats)
            traffic, self._traffic = self._traffic, defaultdict(CollectiveStats)
        return CommSnapshot(by_collective=dict(stats), by_traffic=dict(traffic))


class _TimedWork(dist.Work):
    """An async ``dist.Work`` that times how long ``wait()`` blocks.

    It subclasses ``dist.Work`` because torchrec checks ``isinstance(req, dist.Work)``
    before waiting; everything but ``wait`` is delegated to the real work.
    """

    def __init__(
        self, work: dist.Work, counter: CommCounter, name: str, traffic: str | None
    ) -> None:
        super().__init__()
        self._work = work
        self._counter = counter
        self._name = name
        self._traffic = traffic

    def wait(self, timeout: Any = None) -> bool:
        start = time.perf_counter()
        try:
            return self._work.wait() if timeout is None else self._work.wait(timeout)
        finally:
            self._counter.add_blocked(
                self._name, time.perf_counter() - start, traffic=self._traffic
            )

    def is_completed(self) -> bool:
        return self._work.is_completed()

    def is_success(self) -> bool:
        return self._work.is_success()

    def exception(self) -> Any:
        return self._work.exception()

    def result(self) -> list[torch.Tensor]:
        return self._work.result()

    def get_future(self) -> torch.futures.Future:
        return self._work.get_future()

    def synchronize(self) -> None:
        self._work.synchronize()

    def source_rank(self) -> int:
        return self._work.source_rank()


def _group_ranks(group: Any) -> list[int]:
    if group is None or group is dist.GroupMember.WORLD:
        return list(range(dist.get_world_size()))
    return dist.get_process_group_ranks(group)


def _sends(name: str, bound: dict[str, Any]) -> dict[int, int]:
    """Bytes per global destination rank for a call of collective ``name``."""
    ranks = _group_ranks(bound.get("group"))
    size = len(ranks)
    me = ranks.index(dist.get_rank()) if dist.get_rank() in ranks else 0
    if name == "all_to_all_single":
        per_rank = sends.all_to_all_single_sends(
            bound["input"], bound.get("input_split_sizes"), size
        )
    elif name == "all_to_all":
        per_rank = sends.all_to_all_list_sends(bound["input_tensor_list"])
    elif name == "all_reduce":
        per_rank = sends.ring_sends(sends.tensor_bytes(bound["tensor"]), size, me, 2.0)
    elif name == "all_gather":
        per_rank = sends.ring_sends(sends.tensor_bytes(bound["tensor"]) * size, size, me, 1.0)
    elif name in ("all_gather_into_tensor", "all_gather_single"):
        per_rank = sends.ring_sends(sends.tensor_bytes(bound["output_tensor"]), size, me, 1.0)
    elif name == "reduce_scatter":
        total = sum(sends.tensor_bytes(t) for t in bound["input_list"])
        per_rank = sends.ring_sends(total, size, me, 1.0)
    elif name in ("reduce_scatter_tensor", "reduce_scatter_single"):
        per_rank = sends.ring_sends(sends.tensor_bytes(bound["input"]), size, me, 1.0)
    else:
        assert name == "broadcast"
        group_src = bound.get("group_src")
        if group_src is None:
            src = bound.get("src") or 0
            group_src = ranks.index(src) if src in ranks else 0
        per_rank = sends.broadcast_sends(sends.tensor_bytes(bound["tensor"]), size, me, group_src)
    return {ranks[i]: b for i, b in enumerate(per_rank)}


def _binder(*params: str) -> Callable[..., dict[str, Any]]:
    def bind(*args: Any, **kwargs: Any) -> dict[str, Any]:
        bound = dict(zip(params, args, strict=False))
        bound.update(kwargs)
        return bound

    return bind


_BINDERS: dict[str, Callable[..., dict[str, Any]]] = {
    "all_to_all_single": _binder(
        "output", "input", "output_split_sizes", "input_split_sizes", "group", "async_op"
    ),
    "all_to_all": _binder("output_tensor_list", "input_tensor_list", "group", "async_op"),
    "all_reduce": _binder("tensor", "op", "group", "async_op"),
    "all_gather": _binder("tensor_list", "tensor", "group", "async_op"),
    "all_gather_into_tensor": _binder("output_tensor", "input_tensor", "group", "async_op"),
    "all_gather_single": _binder("output_tensor", "input_tensor", "group", "async_op"),
    "reduce_scatter": _binder("output", "input_list", "op", "group", "async_op"),
    "reduce_scatter_tensor": _binder("output", "input", "op", "group", "async_op"),
    "reduce_scatter_single": _binder("output", "input", "op", "group", "async_op"),
    "broadcast": _binder("tensor", "src", "group", "async_op", "group_src"),
}


def _wrap(name: str, original: Callable[..., Any], counter: CommCounter) -> Callable[..., Any]:
    @functools.wraps(original)
    def counted(*args: Any, **kwargs: Any) -> Any:
        bound = _BINDERS[name](*args, **kwargs)
        payload = bound.get("input", bound.get("tensor", bound.get("input_tensor")))
        dtype = payload.dtype if isinstance(payload, torch.Tensor) else None
        label = current_traffic()
        counter.record(name, _sends(name, bound), dtype, traffic=label)
        start = time.perf_counter()
        result = original(*args, **kwargs)
        if result is None:
            counter.add_blocked(name, time.perf_counter() - start, traffic=label)
            return None
        return _TimedWork(result, counter, name, label)

    counted.__embark_original__ = original  # type: ignore[attr-defined]
    return counted


@contextlib.contextmanager
def counting_collectives(counter: CommCounter) -> Iterator[CommCounter]:
    """Count every ``torch.distributed`` collective issued inside the block.

    Nesting is not supported: an inner block would double count.
    """
    originals = {name: getattr(dist, name) for name in _COLLECTIVES if hasattr(dist, name)}
    if any(hasattr(fn, "__embark_original__") for fn in originals.values()):
        raise RuntimeError("counting_collectives is already active in this process")
    try:
        for name, original in originals.items():
            setattr(dist, name, _wrap(name, original, counter))
        yield counter
    finally:
        for name, original in originals.items():
            setattr(dist, name, original)


def register_ddp_counting_hook(ddp_module: torch.nn.parallel.DistributedDataParallel) -> None:
    """Route DDP's bucketed gradient all-reduce through ``dist.all_reduce`` so it is counted.

    DDP's reducer calls the process group from C++, out of :func:`counting_collectives`'
    sight; its stock all-reduce communication hook does the same reduction through the
    Python API instead, so the counter sees it as ``all_reduce`` (``dense`` traffic).
    """
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    # wraps: DDP checks the hook's signature (a real ``dist.GradBucket`` annotation, not
    # this module's string one); inspect follows ``__wrapped__`` to the stock hook's.
    @functools.wraps(default_hooks.allreduce_hook)
    def counted_allreduce(
        process_group: Any, bucket: dist.GradBucket
    ) -> torch.futures.Future[torch.Tensor]:
        with traffic("dense"):
            return default_hooks.allreduce_hook(process_group, bucket)

    ddp_module.register_comm_hook(ddp_module.process_group, counted_allreduce)
