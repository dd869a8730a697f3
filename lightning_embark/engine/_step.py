"""One step through the clusters: every cluster in plan order, its exchange on the lane.

Forward starts every cluster in plan order (its lookups and encoding run on the caller's
thread, its exchange and pooling on the engine's lane,
:mod:`lightning_embark.engine._lane`), then waits for their results in the same order;
backward likewise starts every cluster's gradient encoding here and its gradient exchange
and update on the lane, and the engine lets them run past the end of backward: it settles
them (:func:`settle`) before anything reads or exchanges the blocks again (the next lookup,
a checkpoint, a collective on its group). Without overlap the lane runs each piece inline,
which is the same sequence of collectives and the same arithmetic, one cluster after the
other.

A failure (a rejected batch, a dead peer) leaves nothing of the step in flight: the lane is
drained before the error propagates, so the next step starts from an idle lane. A peer's
failure is re-raised as a :class:`~lightning_embark.errors.PeerError` naming this rank, the
cluster and the phase.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from lightning_embark.engine._jagged import JaggedBatch
from lightning_embark.engine._lane import Lane, Pending
from lightning_embark.engine.clusters import Cluster
from lightning_embark.errors import ConfigError
from lightning_embark.exchange import peer_failures

#: A cluster with the positions (in the engine's feature order) of its features.
Placed = tuple[Cluster, list[int]]
#: Clusters' work under way on the lane: each cluster's name and its pending result.
Started = list[tuple[str, "Pending[None]"]]
#: A step's forward: the output, and the backward that takes the output's gradient.
Step = Callable[[], tuple[torch.Tensor, Callable[[torch.Tensor], None]]]


class StepNode(torch.autograd.Function):
    """One autograd node for all of an engine's clusters, so that backward runs them in
    plan order on every rank (one node per cluster would let autograd order them).

    ``apply(step, anchor)``: ``step()`` runs the forward and returns the output and its
    backward; ``anchor`` is a tensor that requires grad (the batch has none to hang the
    node on).
    """

    @staticmethod
    def forward(ctx: Any, step: Step, anchor: torch.Tensor) -> torch.Tensor:
        values, ctx.run_backward = step()
        return values

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, None]:
        if ctx.run_backward is None:
            raise ConfigError(
                "backward ran twice through the sharded embeddings; their optimizer already "
                "applied the first gradient (fused update), so retain_graph / double backward is "
                "not supported"
            )
        ctx.run_backward(grad.contiguous())
        ctx.run_backward = None  # the step's states go with it
        return None, None


def forward_clusters(
    clusters: Sequence[Placed],
    batch: JaggedBatch,
    *,
    error: ConfigError | None,
    keep: bool,
    lane: Lane,
    prepared: Mapping[int, Any],
    rank: int,
) -> tuple[list[torch.Tensor | None], list[Any]]:
    """Every cluster's pooled ``[B, sum(d)]`` (its features in its order; None for a
    cluster skipped after an error), and their backward states.

    Args:
        clusters: The engine's clusters in plan order.
        batch: The rank's batch, every feature position.
        error: This rank's batch failed its checks: clusters that exchange still take part
            in their first collective (so no peer waits) and raise it; the others are
            skipped (state None).
        keep: Keep what backward needs (training).
        lane: Where the clusters' collectives run, in order.
        prepared: Input distributions run ahead by the input pipeline, by cluster index
            (each holds the cluster's part of the batch).
        rank: This rank, for peer-failure messages.
    """
    pooled: list[torch.Tensor | None] = [None] * len(clusters)
    states: list[Any] = []
    started: list[tuple[int, str, Pending[torch.Tensor]]] = []
    try:
        # Each cluster's exchange runs on the lane while the next one looks up.
        for index, (cluster, positions) in enumerate(clusters):
            if error is not None and not cluster.exchanges:
                states.append(None)
                continue
            ahead = prepared.get(index)
            given = {"prepared": ahead} if ahead is not None else {}
            part = ahead.batch if ahead is not None else batch.select(positions)
            with peer_failures(rank, cluster.name, "forward"):
                out, state = cluster.start_forward(
                    part, keep_for_backward=keep, lane=lane, error=error, **given
                )
            states.append(state)
            started.append((index, cluster.name, out))
        for index, name, out in started:
            with peer_failures(rank, name, "forward"):
                pooled[index] = out.wait()
    except BaseException:
        lane.drain()  # nothing of this step left in flight
        raise
    return pooled, states


def start_backward(
    clusters: Sequence[Placed],
    states: Sequence[Any],
    grads: Sequence[torch.Tensor],
    *,
    lane: Lane,
    rank: int,
) -> Started:
    """Start sending every cluster's gradient (``grads``: one ``[B, sum(d)]`` per cluster)
    to its owners and updating them; :func:`settle` waits for the updates.

    Each cluster encodes here while the previous one's gradients travel and update on the
    lane. Without overlap everything is done when this returns.
    """
    started: Started = []
    try:
        for (cluster, _), state, grad in zip(clusters, states, grads, strict=True):
            with peer_failures(rank, cluster.name, "backward"):
                pending = cluster.start_backward(state, grad, lane=lane)
            started.append((cluster.name, pending))
    except BaseException:
        lane.drain()
        raise
    return started


def settle(started: Started, *, lane: Lane, rank: int) -> None:
    """Wait for the updates :func:`start_backward` started, in plan order.

    Raises:
        PeerError: a peer failed during a cluster's backward (named); the lane is drained
            first.
    """
    try:
        for name, pending in started:
            with peer_failures(rank, name, "backward"):
                pending.wait()
    except BaseException:
        lane.drain()
        raise
