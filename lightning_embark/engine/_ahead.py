"""The engine's side of the input pipeline: which clusters run ahead, and the hand-over.

:class:`~lightning_embark.engine._pipeline.InputPipeline` runs work a step ahead on a
thread and process group of its own. This module says what that work is for an engine:
the input distribution (:meth:`~lightning_embark.engine.clusters.Cluster.distribute`:
headers, then IDs to their owners) of every cluster that has one (RB and UB; DP tables
and towers distribute no IDs), and gives it to the lookup of the same batch, found by
its key (the tensor of the first feature's IDs, compared by identity).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch

from lightning_embark.engine._jagged import JaggedBatch
from lightning_embark.engine._pipeline import InputPipeline
from lightning_embark.engine._step import Placed
from lightning_embark.errors import ConfigError


class AheadDistribution:
    """The input distributions of an engine's clusters, run a step ahead.

    Args:
        clusters: The engine's clusters in plan order (at least one distributes input).
        device: The engine's device.
        rank: This rank (rank 0 warns when lookups miss what was prefetched).
    """

    def __init__(self, clusters: Sequence[Placed], device: torch.device, rank: int) -> None:
        self._clusters = list(clusters)
        self.indices = [i for i, (c, _) in enumerate(clusters) if c.distributes_input]
        assert self.indices, "no cluster distributes input: nothing to run ahead"
        self.pipeline: InputPipeline[dict[int, Any]] = InputPipeline(device)
        self._rank = rank
        self._warned = False

    def submit(
        self,
        key: torch.Tensor,
        batch: JaggedBatch,
        error: ConfigError | None,
        check: Callable[[JaggedBatch], ConfigError | None],
    ) -> None:
        """Distribute ``batch`` ahead (``check`` finds out-of-range IDs on the worker unless
        ``error`` is already known); a lookup with ``key`` takes the result."""

        def distribute() -> dict[int, Any]:
            checked = error if error is not None else check(batch)
            return {
                i: self._clusters[i][0].distribute(
                    batch.select(self._clusters[i][1]), error=checked, ahead=True
                )
                for i in self.indices
            }

        self.pipeline.submit(key, distribute, inputs=batch)

    def take(self, key: torch.Tensor | None) -> dict[int, Any] | None:
        """The distributions run ahead for the batch of ``key`` (by cluster index), or None.

        A training lookup that finds none while prefetched batches wait means the model
        looked up something else than what was prefetched (e.g. it rebuilt its input):
        the batch is distributed in the step, correctly but with nothing gained, and rank 0
        warns once. Validation lookups (no grad) miss by design.
        """
        if key is None:
            return None
        prepared = self.pipeline.take(key)
        waiting = self.pipeline.pending
        if prepared is None and waiting and torch.is_grad_enabled() and not self._warned:
            self._warned = True
            if self._rank == 0:
                warnings.warn(
                    f"the input pipeline prefetched {waiting} batch(es) but the lookup got "
                    "other ID tensors (did the model rebuild its KeyedJaggedTensor?); their "
                    "input was distributed again inside the step, so the pipeline saves "
                    "nothing: pass the batch's features unchanged, or turn the pipeline off",
                    RuntimeWarning,
                    stacklevel=5,
                )
        return prepared
