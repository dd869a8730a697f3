"""The step's collective lane: one cluster's exchange overlapping the next cluster's work.

Inside a step the engine runs its clusters in plan order. Cluster ``k``'s rows exchange
(and the decode and pooling that follow it) needs nothing from cluster ``k + 1``, and
cluster ``k + 1``'s lookup needs nothing from cluster ``k``'s exchange. The lane runs the
exchanges on one worker thread, so the training thread looks cluster ``k + 1``'s rows up
while cluster ``k``'s cross the link; in backward, cluster ``k``'s gradients travel and
update its owners' rows while cluster ``k + 1`` encodes its own. With ``n`` clusters whose
lookups take ``L_k`` and exchanges ``X_k``, a forward then takes about
``L_1 + sum_k max(X_k, L_(k+1)) + X_n`` instead of ``sum_k (L_k + X_k)``.

Order is what makes it safe: ranks must issue the collectives of a process group in the
same order. Every collective the clusters issue on the engine's groups goes through the
lane (the synchronous ones too, :meth:`Lane.run`), and the lane runs work in the order it
was submitted, from one thread, so every rank issues the same sequence whatever the thread
timing. The input pipeline has a group of its own; the tower stage and the dense
all-reduce issue theirs after the lane is drained, or on groups of their own.

Traffic labels (:mod:`lightning_embark._traffic`) and the dispatch counter are per thread:
the work runs under what was active where it was submitted (:mod:`lightning_embark._handover`).

On CUDA the worker runs on a side stream of the engine's device, and makes that device its
current one first (the current CUDA device is per thread, and a new thread's is device 0:
NCCL, the caching allocator and every ``torch.cuda`` call without a device would otherwise
use another rank's GPU). Submitting records an event on the submitting
thread's current stream, which the side stream waits for (the work's inputs are ready),
and the inputs are recorded on the side stream (the caching allocator must not hand their
memory out while it still reads them); :meth:`Pending.wait` makes the caller's stream wait
for an event recorded after the work and records the result on it. That path has not run
on a GPU yet.

After a job fails because of a peer (a dead rank, a dropped connection), the lane runs
nothing more: every later job fails at once with that failure (:func:`stopped_by`).

Without overlap (``Lane(overlap=False)``) the same calls run inline, in the same order:
results are bit-identical either way, since every cluster computes the same values and
only when they are computed moves.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any, Generic, TypeVar

import torch

from lightning_embark._handover import Handover, capture, restored
from lightning_embark.exchange import stopped_by

T = TypeVar("T")

_Job = tuple[Callable[[], Any], "Future[tuple[Any, Any]]", Handover, Any]


class Pending(Generic[T]):
    """A result of the lane: :meth:`wait` returns it (or raises what the work raised)."""

    def __init__(
        self,
        *,
        future: Future[tuple[T, Any]] | None = None,
        value: T | None = None,
        device: torch.device | None = None,
    ) -> None:
        self._future = future
        self._value = value
        self._device = device

    @staticmethod
    def done(value: T) -> Pending[T]:
        """A result that is already there (work with nothing to wait for)."""
        return Pending(value=value)

    def wait(self) -> T:
        """The work's result, once it finished; on CUDA, usable on the caller's stream.

        Raises:
            Exception: whatever the work raised, here, on the thread that waits.
        """
        if self._future is None:
            return self._value  # type: ignore[return-value]  # set with no future
        result, event = self._future.result()
        return handed_over(result, event, self._device)

    def finish(self) -> BaseException | None:
        """Wait until the work finished, without taking its result: what it raised, or
        None (a result no one will use, e.g. a prefetched batch dropped)."""
        return self._future.exception() if self._future is not None else None


class Lane:
    """Runs submitted work in submission order on one worker thread (or inline).

    Args:
        device: The engine's device (a side CUDA stream is used when it is CUDA).
        overlap: Run work on the worker thread, returning at once (True), or inline on
            the caller's thread (False: the same order, nothing overlaps).
        name: The worker thread's name.
    """

    def __init__(self, device: torch.device, *, overlap: bool, name: str = "embark-lane") -> None:
        self._device = device
        self.overlap = overlap
        self._name = name
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._stream = torch.cuda.Stream(device) if overlap and device.type == "cuda" else None
        self._outstanding: list[Future[tuple[Any, Any]]] = []

    def start(self, work: Callable[[], T], *, inputs: Any = ()) -> Pending[T]:
        """Run ``work`` after everything submitted before; its result is the
        :class:`Pending`'s.

        Args:
            work: What to run (it may issue collectives on the engine's groups).
            inputs: Tensors ``work`` reads that the caller made (CUDA: recorded on the
                side stream so that their memory is not reused while it reads them).
        """
        if not self.overlap:
            return Pending.done(work())
        ready = None
        if self._stream is not None:
            ready = torch.cuda.Event()
            ready.record(torch.cuda.current_stream(self._device))
        future: Future[tuple[T, Any]] = Future()
        self._outstanding = [f for f in self._outstanding if not f.done()]
        self._outstanding.append(future)
        if self._thread is None:
            # A daemon: work stuck in a collective with a dead peer must not hold the
            # process; the error surfaces where the training thread waits.
            self._thread = threading.Thread(target=self._serve, name=self._name, daemon=True)
            self._thread.start()
        self._jobs.put((work, future, capture(), (ready, inputs)))
        return Pending(future=future, device=self._device)

    def run(self, work: Callable[[], T], *, inputs: Any = ()) -> T:
        """``work``'s result, run in its turn (after everything submitted before)."""
        return self.start(work, inputs=inputs).wait()

    def drain(self) -> None:
        """Wait until every submitted work finished, whatever it raised (after an error,
        so that the next step starts with nothing of this one in flight)."""
        for future in self._outstanding:
            future.exception()
        self._outstanding = []

    def close(self, *, wait: bool = True) -> None:
        """Finish the submitted work and stop the worker (a later :meth:`start` starts a
        new one).

        Args:
            wait: Wait for the submitted work (True). False, after an error: the work is
                left to the daemon worker, which stops once it returns. A peer's failure
                can leave this rank's work waiting in a collective for a live peer that
                waits in turn for this rank elsewhere (in Lightning's barrier, say); only
                this rank's exit, which closes its sockets, frees that peer.
        """
        if wait:
            self.drain()
        self._outstanding = []
        if self._thread is not None:
            self._jobs.put(None)
            if wait:
                self._thread.join()
            self._thread = None

    def _serve(self) -> None:
        if self._stream is not None:
            torch.cuda.set_device(self._device)
        stopped: BaseException | None = None
        while (job := self._jobs.get()) is not None:
            work, future, handover, (ready, inputs) = job
            if stopped is not None:
                future.set_exception(stopped)
                continue
            try:
                with restored(handover):
                    future.set_result(on_stream(self._stream, work, ready=ready, inputs=inputs))
            except BaseException as error:  # handed to wait(), on the training thread
                future.set_exception(error)
                stopped = stopped_by(error)


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
            so that the caching allocator does not reuse their memory while it reads them
            (host tensors among them are left alone: they have no stream).
    """
    if stream is None:
        return work(), None
    with torch.cuda.stream(stream):
        if ready is not None:
            stream.wait_event(ready)
        for tensor in tensors_in(inputs):
            if tensor.is_cuda:
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
            if tensor.is_cuda:
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


#: The lane that runs everything inline, at once (a cluster used on its own).
INLINE = Lane(torch.device("cpu"), overlap=False)
