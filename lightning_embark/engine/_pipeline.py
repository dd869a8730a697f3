"""The input pipeline: a batch's input distribution run one step ahead of its lookup.

A step of an RB or UB cluster starts by sending every request's IDs to their owners
(headers, then IDs: :meth:`~lightning_embark.engine.clusters.Cluster.distribute`). None of
that reads a weight, so it can run for batch ``i + 1`` while batch ``i`` computes, as
torchrec's ``TrainPipelineSparseDist`` runs its input distribution. The lookups cannot
move: they read the rows that batch ``i``'s backward updates.

:class:`InputPipeline` runs submitted distributions in order on one worker thread (so every
rank issues them in the same order) over a process group of their own (so they never
interleave with a step's exchanges on the engine's group), and hands each result to the
lookup that asks for it by key: the tensor of IDs the batch arrived in, compared by
identity. A lookup whose key was not submitted (a model that rebuilt its input, a
validation batch) distributes its batch itself, as without a pipeline; results are the
same bit for bit either way.

On CUDA the worker runs on a side stream; the lookup's stream waits for an event recorded
after the distribution, and the tensors it hands over are recorded on the lookup's stream
(the caching allocator must not reuse them while that stream still reads them). That path
has not run on a GPU yet.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any, Generic, TypeVar

import torch

from lightning_embark._traffic import AHEAD, traffic

T = TypeVar("T")


class InputPipeline(Generic[T]):
    """Runs work submitted under a key on one worker thread; :meth:`take` hands it over.

    Args:
        device: The engine's device (a side CUDA stream is used when it is CUDA).
        depth: Results kept waiting at most; submitting more drops the oldest (after it
            finished: its collectives are under way on every rank). Lightning's data
            fetcher holds one batch ahead, so two are pending during a step.
    """

    def __init__(self, device: torch.device, *, depth: int = 4) -> None:
        assert depth >= 1
        self._device = device
        self._depth = depth
        self._pending: deque[tuple[torch.Tensor, Future[tuple[T, Any]]]] = deque()
        self._queue: queue.Queue[tuple[Callable[[], T], Future[tuple[T, Any]]] | None] = (
            queue.Queue()
        )
        self._stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self._thread: threading.Thread | None = None
        #: Lookups that found their distribution done ahead, and lookups that did not.
        self.hits = 0
        self.misses = 0

    def submit(self, key: torch.Tensor, work: Callable[[], T]) -> None:
        """Run ``work`` after everything submitted before; :meth:`take` with ``key`` gets
        its result (or its exception)."""
        while len(self._pending) >= self._depth:
            _, dropped = self._pending.popleft()
            dropped.exception()  # wait; its result (or error) is no one's
        future: Future[tuple[T, Any]] = Future()
        if self._thread is None:
            # A daemon: a distribution stuck on a dead peer must not hold the process.
            self._thread = threading.Thread(target=self._serve, name="embark-input", daemon=True)
            self._thread.start()
        self._queue.put((work, future))
        self._pending.append((key, future))

    def take(self, key: torch.Tensor) -> T | None:
        """The result submitted under ``key`` (identity), waiting for it; results submitted
        before it are dropped. None when ``key`` was not submitted (counted as a miss).

        Raises:
            Exception: whatever the work raised (e.g. a peer's rejected batch), here, on
                the thread that asked.
        """
        position = next((i for i, (k, _) in enumerate(self._pending) if k is key), None)
        if position is None:
            self.misses += 1
            return None
        for _ in range(position):
            _, dropped = self._pending.popleft()
            dropped.exception()
        _, future = self._pending.popleft()
        result, event = future.result()
        self.hits += 1
        return handed_over(result, event, self._device)

    @property
    def pending(self) -> int:
        """Results submitted and not yet taken or dropped."""
        return len(self._pending)

    def close(self) -> None:
        """Finish the submitted work (dropping its results) and stop the worker; a later
        :meth:`submit` starts a new one."""
        for _, future in self._pending:
            future.exception()
        self._pending.clear()
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None

    def _serve(self) -> None:
        while (item := self._queue.get()) is not None:
            work, future = item
            try:
                future.set_result(self._run(work))
            except BaseException as error:  # handed to take(), on the caller's thread
                future.set_exception(error)

    def _run(self, work: Callable[[], T]) -> tuple[T, Any]:
        with traffic(AHEAD):  # no step waits in it: out of the blocked share
            return on_stream(self._stream, work)


def on_stream(
    stream: Any, work: Callable[[], T], *, ready: Any = None, inputs: Any = ()
) -> tuple[T, Any]:
    """``work()`` on a side CUDA ``stream`` (None: as it is, no event), and an event recorded
    on it after the work.

    Args:
        stream: The side stream, or None (CPU).
        work: What to run.
        ready: An event the stream waits for first (the work's inputs are made), or None.
        inputs: Tensors made on another stream that the work reads: recorded on ``stream``,
            so that the caching allocator does not reuse their memory while it reads them.
    """
    if stream is None:
        return work(), None
    with torch.cuda.stream(stream):
        if ready is not None:
            stream.wait_event(ready)
        for tensor in tensors_in(inputs):
            tensor.record_stream(stream)
        result = work()
        event = torch.cuda.Event()
        event.record(stream)
    return result, event


def handed_over(result: T, event: Any, device: torch.device | None) -> T:
    """``result`` of :func:`on_stream`, usable on the calling thread's current stream: that
    stream waits for ``event`` (None: nothing to wait for), and every tensor in ``result`` is
    recorded on it."""
    if event is not None:
        current = torch.cuda.current_stream(device)
        current.wait_event(event)
        for tensor in tensors_in(result):
            tensor.record_stream(current)
    return result


def tensors_in(value: Any) -> Iterator[torch.Tensor]:
    """Every tensor inside ``value``: through lists, tuples, dicts and dataclasses (what a
    cluster's distribution is made of)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, list | tuple):
        for item in value:
            yield from tensors_in(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from tensors_in(item)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for field in dataclasses.fields(value):
            yield from tensors_in(getattr(value, field.name))
