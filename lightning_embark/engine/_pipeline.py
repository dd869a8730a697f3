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

The worker is a :class:`~lightning_embark.engine._lane.Lane` of its own: on CUDA it runs on a
side stream after the batch is made, and the lookup's stream waits for the distribution
(not yet run on a GPU).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import torch

from lightning_embark._traffic import AHEAD, traffic
from lightning_embark.engine._lane import Lane, Pending

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
        self._depth = depth
        self._pending: deque[tuple[torch.Tensor, Pending[T]]] = deque()
        self._lane = Lane(device, overlap=True, name="embark-input")
        #: Lookups that found their distribution done ahead, and lookups that did not.
        self.hits = 0
        self.misses = 0

    def submit(self, key: torch.Tensor, work: Callable[[], T], *, inputs: Any = ()) -> None:
        """Run ``work`` after everything submitted before; :meth:`take` with ``key`` gets
        its result (or its exception). ``inputs``: the tensors it reads (see
        :meth:`Lane.start`)."""
        while len(self._pending) >= self._depth:
            _, dropped = self._pending.popleft()
            dropped.finish()  # its result (or error) is no one's

        def ahead() -> T:
            with traffic(AHEAD):  # no step waits in it: out of the blocked share
                return work()

        self._pending.append((key, self._lane.start(ahead, inputs=inputs)))

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
            dropped.finish()
        _, pending = self._pending.popleft()
        result = pending.wait()
        self.hits += 1
        return result

    @property
    def pending(self) -> int:
        """Results submitted and not yet taken or dropped."""
        return len(self._pending)

    def close(self, *, wait: bool = True) -> None:
        """Finish the submitted work (dropping its results) and stop the worker; a later
        :meth:`submit` starts a new one. ``wait=False`` leaves the work to the worker
        (after an error: see :meth:`~lightning_embark.engine._lane.Lane.close`)."""
        if wait:
            for _, pending in self._pending:
                pending.finish()
        self._pending.clear()
        self._lane.close(wait=wait)
