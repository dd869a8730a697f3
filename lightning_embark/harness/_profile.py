"""Each embedding cluster's exchanges measured against the link's own limit, and what a GPU
would see of a step.

``embark-bench --profile`` labels every collective an embark cluster issues with its
cluster and phase (:func:`label_cluster_phases`), so the byte counter
(:mod:`lightning_embark.accounting`) totals bytes and blocked time per
``exchange:<cluster>:<phase>`` traffic label; and every run (torchrec's too) counts one
training step's ATen ops, would-be host syncs and collectives (:func:`dispatch_step`,
:func:`summarize_dispatch`). Phases, in the order a step runs them:

* ``header`` - the batch size and per-request ID counts to every peer;
* ``ids`` - the IDs (RB: with bag lengths and weights) to their owners;
* ``rows`` - the owners' answers (RB: pooled partial sums, host-reduced when
  hierarchical; UB: unique rows);
* ``grads`` - the gradients back to the owners (DP: the all-reduce of its tables);
* ``sync`` - replica and column-shard gradient syncs of the owners, when the plan has them.

The labels are put on the cluster objects from outside the engine (instance
attributes over its methods), so the engine stays unaware of them; the engine's
``_clusters`` list is the one thing read from it.

Efficiency of one phase (:func:`efficiency`)::

    link_bytes = max over hosts h of sum over ranks r on h of inter_bytes(r)
    efficiency = (link_bytes / link_rate) / seconds

``inter_bytes(r)`` is what rank ``r`` sent to ranks of other hosts in the phase (the
counter's inter-host bytes). Every emulated host has one shaped veth, each direction
limited to the link rate and shared by all its ranks, so a host's egress is the sum of
its ranks' sends; ingress equals it for the balanced exchanges of a plan (and exactly,
for two hosts, the other host's egress), so the busiest host's egress is the least
time the phase can take: ``link_bytes / link_rate``. ``seconds`` is the phase's time,
the slowest rank's blocked seconds in the phase's collectives (a rank waiting for a
late peer is part of the exchange as the step sees it). 1.0 means the phase ran at line
rate; intra-host bytes are not in the numerator (they take loopback, ~18x faster).
"""

from __future__ import annotations

import functools
import statistics
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from lightning_embark._traffic import current_traffic, is_ahead, traffic, under_ahead
from lightning_embark.accounting import engine_clusters

#: Traffic-label prefix of the profiled cluster phases: ``exchange:<cluster>:<phase>``.
LABEL_PREFIX = "exchange:"
PHASES = ("header", "ids", "rows", "grads", "sync")
#: The forward's exchanges through the cluster's own exchange object, in call order
#: (the rows go through ``receive``, which labels them itself).
_FORWARD_CALLS = ("header", "ids")
#: Not a phase: marks "inside forward, outside receive" for the exchange wrapper.
_FORWARD = "forward"


def phase_label(cluster: str, phase: str) -> str:
    """The traffic label of ``phase`` of ``cluster``."""
    return f"{LABEL_PREFIX}{cluster}:{phase}"


def split_label(label: str) -> tuple[str, str] | None:
    """``(cluster, phase)`` of a profile label, None for any other label."""
    label = label.removeprefix(under_ahead(""))
    if not label.startswith(LABEL_PREFIX):
        return None
    cluster, _, phase = label[len(LABEL_PREFIX) :].rpartition(":")
    return (cluster, phase) if cluster and phase in PHASES else None


class _PhaseTracker:
    """Labels one cluster's collectives by phase, from wrappers over its methods.

    ``start_forward`` and ``distribute`` (the input distribution, which the engine's
    input pipeline may run ahead of the step on another thread, and the engine's lane
    runs on its worker: the state is per thread) reset the call index; exchange calls
    made directly inside them are ``header`` then ``ids`` (the order
    :class:`RemoteCluster` issues them); anything inside ``receive`` is ``rows`` (flat
    rows, or RB's host reduction, which does not go through the exchange object);
    ``grads_to_owners`` is ``grads``; the rest of the backward (replica and column syncs)
    is ``sync``, except for clusters without ``grads_to_owners`` (DP), whose whole
    backward is ``grads``. Work the lane runs carries the labels of where it was
    submitted; a phase inside the input pipeline stays its traffic
    (:func:`~lightning_embark._traffic.under_ahead`).
    """

    def __init__(self, cluster: Any) -> None:
        self.name = str(cluster.name)
        # Per thread, as traffic labels are: the engine's input pipeline distributes the
        # next batch on a thread of its own while this one's step runs.
        self._state = threading.local()

    @property
    def calls(self) -> int:
        """Exchange calls so far in this thread's current forward or distribution."""
        return int(getattr(self._state, "calls", 0))

    @calls.setter
    def calls(self, value: int) -> None:
        self._state.calls = value

    @property
    def inner(self) -> str | None:
        """The phase (or marker) the innermost wrapped method set in this thread."""
        return getattr(self._state, "inner", None)

    @inner.setter
    def inner(self, value: str | None) -> None:
        self._state.inner = value

    @contextmanager
    def phase(self, phase: str) -> Iterator[None]:
        """Inside ``phase``; every phase but the ``forward`` marker is a traffic label."""
        outer, self.inner = self.inner, phase
        try:
            if phase == _FORWARD:
                yield
            else:
                label = phase_label(self.name, phase)
                # Under the input pipeline, still its (ahead) traffic: nested, not replaced.
                with traffic(under_ahead(label) if is_ahead(current_traffic()) else label):
                    yield
        finally:
            self.inner = outer

    def wrap(self, method: Callable[..., Any], phase: str, *, reset: bool = False) -> Any:
        @functools.wraps(method)
        def labelled(*args: Any, **kwargs: Any) -> Any:
            if reset:
                self.calls = 0
            with self.phase(phase):
                return method(*args, **kwargs)

        return labelled

    def wrap_exchange(self, exchange: Any) -> Any:
        tracker = self

        class _Labelled:
            """The cluster's exchange, labelling the forward's direct calls by order."""

            def __getattr__(self, name: str) -> Any:
                return getattr(exchange, name)

            def __call__(self, *args: Any, **kwargs: Any) -> Any:
                if tracker.inner != _FORWARD:
                    return exchange(*args, **kwargs)
                phase = _FORWARD_CALLS[min(tracker.calls, len(_FORWARD_CALLS) - 1)]
                tracker.calls += 1
                with tracker.phase(phase):
                    return exchange(*args, **kwargs)

        return _Labelled()


def label_cluster_phases(root: Any) -> list[str]:
    """Label the collectives of every engine cluster under ``root`` by cluster and phase.

    Installs instance attributes over ``start_forward``, ``distribute``, ``receive``,
    ``grads_to_owners``, ``start_backward``, ``exchange`` and ``input_exchange`` of each
    cluster
    that has them (idempotent: a labelled cluster is
    skipped). Returns the labelled clusters' names.
    """
    names = []
    for cluster in engine_clusters(root):
        if getattr(cluster, "_embark_phase_tracker", None) is not None:
            names.append(cluster.name)
            continue
        tracker = _PhaseTracker(cluster)
        owners = hasattr(cluster, "grads_to_owners")
        cluster.start_forward = tracker.wrap(cluster.start_forward, _FORWARD, reset=True)
        if hasattr(cluster, "distribute"):  # headers and IDs, possibly ahead of the step
            cluster.distribute = tracker.wrap(cluster.distribute, _FORWARD, reset=True)
        cluster.start_backward = tracker.wrap(
            cluster.start_backward, "sync" if owners else "grads"
        )
        if hasattr(cluster, "receive"):
            cluster.receive = tracker.wrap(cluster.receive, "rows")
        if owners:
            cluster.grads_to_owners = tracker.wrap(cluster.grads_to_owners, "grads")
        for attribute in ("exchange", "input_exchange"):  # the pipeline's, if any
            if getattr(cluster, attribute, None) is not None:
                setattr(cluster, attribute, tracker.wrap_exchange(getattr(cluster, attribute)))
        cluster._embark_phase_tracker = tracker
        names.append(tracker.name)
    return names


def link_bytes(inter_bytes_by_rank: Sequence[float], ranks_per_host: int) -> float:
    """Bytes the busiest host sends over its link: the sum of its ranks' inter-host bytes,
    the largest over hosts (rank ``r`` is on host ``r // ranks_per_host``)."""
    if ranks_per_host < 1:
        raise ValueError(f"ranks_per_host must be >= 1, got {ranks_per_host}")
    hosts: dict[int, float] = {}
    for rank, sent in enumerate(inter_bytes_by_rank):
        hosts[rank // ranks_per_host] = hosts.get(rank // ranks_per_host, 0.0) + sent
    return max(hosts.values(), default=0.0)


def efficiency(link_bytes: float, rate_bytes_per_s: float, seconds: float) -> float | None:
    """``(link_bytes / rate_bytes_per_s) / seconds``: the share of line rate achieved.

    None when nothing crossed, the time is zero or there is no rate (loopback).
    """
    if not link_bytes or not seconds or not rate_bytes_per_s:
        return None
    return (link_bytes / rate_bytes_per_s) / seconds


def mbit_to_bytes_per_s(rate_mbit: float) -> float:
    """A link rate in Mbit/s (``tc``'s unit) as bytes per second."""
    return rate_mbit * 1e6 / 8


def summarize_profile(
    records: list[dict[str, Any]],
    measured: range,
    *,
    ranks_per_host: int,
    rate_mbit: float | None,
) -> list[dict[str, Any]]:
    """Per cluster and phase, over the measured steps of every rank's records.

    Each row: ``cluster``, ``phase``, ``calls`` (per rank per step), ``inter_host_bytes``
    and ``intra_host_bytes`` (per step, summed over ranks), ``link_bytes`` (per step,
    the busiest host's egress, :func:`link_bytes`), ``ms`` (per step, median over steps
    of the slowest rank's blocked time), ``achieved_mb_s`` (``link_bytes / ms``) and
    ``efficiency`` against ``rate_mbit`` (None on loopback, or when nothing crossed).
    Per-step figures are medians over the measured steps.
    """
    rate = mbit_to_bytes_per_s(rate_mbit) if rate_mbit else 0.0
    labels = sorted(
        {
            label
            for r in records
            for i in measured
            if i < len(r["comm"])
            for label in r["comm"][i].get("by_traffic", {})
            if split_label(label) is not None
        },
        key=lambda lb: (split_label(lb)[0], PHASES.index(split_label(lb)[1])),  # type: ignore[index]
    )
    rows = []
    for label in labels:
        cluster, phase = split_label(label)  # type: ignore[misc]
        per_step = []
        for i in measured:
            stats = [r["comm"][i].get("by_traffic", {}).get(label, {}) for r in records]
            inter = [float(s.get("inter_host", 0)) for s in stats]
            per_step.append(
                (
                    link_bytes(inter, ranks_per_host),
                    max(float(s.get("blocked_seconds", 0.0)) for s in stats),
                    sum(inter),
                    sum(float(s.get("intra_host", 0)) for s in stats),
                    statistics.fmean(float(s.get("calls", 0)) for s in stats),
                )
            )
        link = statistics.median(s[0] for s in per_step)
        seconds = statistics.median(s[1] for s in per_step)
        rows.append(
            {
                "cluster": cluster,
                "phase": phase,
                "calls": statistics.median(s[4] for s in per_step),
                "inter_host_bytes": round(statistics.median(s[2] for s in per_step)),
                "intra_host_bytes": round(statistics.median(s[3] for s in per_step)),
                "link_bytes": round(link),
                "ms": 1000 * seconds,
                "achieved_mb_s": link / seconds / 1e6 if seconds else None,
                "efficiency": efficiency(link, rate, seconds),
            }
        )
    return rows


def format_profile_table(run: str, rows: list[dict[str, Any]], rate_mbit: float | None) -> str:
    """One run's profile as a table: per cluster and phase, time, link bytes and efficiency."""
    line = (
        f"{rate_mbit:g} Mbit/s = {mbit_to_bytes_per_s(rate_mbit) / 1e6:.1f} MB/s per direction"
        if rate_mbit
        else "no shaped link (loopback): no efficiency"
    )
    header = (
        f"{'cluster':<14}{'phase':<8}{'calls':>6}{'ms':>9}{'link MB':>9}{'inter MB':>10}"
        f"{'intra MB':>10}{'MB/s':>8}{'eff':>7}"
    )
    lines = [f"{run}: exchange profile against the applied link rate ({line})", header]
    lines.append("-" * len(header))
    for row in rows:
        achieved = row["achieved_mb_s"]
        eff = row["efficiency"]
        lines.append(
            f"{row['cluster']:<14}{row['phase']:<8}{row['calls']:>6.0f}{row['ms']:>9.2f}"
            f"{row['link_bytes'] / 1e6:>9.3f}{row['inter_host_bytes'] / 1e6:>10.3f}"
            f"{row['intra_host_bytes'] / 1e6:>10.3f}"
            f"{'-' if achieved is None else f'{achieved:.1f}':>8}"
            f"{'-' if eff is None else f'{eff:.2f}':>7}"
        )
    return "\n".join(lines)


def dispatch_step(warmup: int) -> int:
    """The training step whose dispatches ``--profile`` counts
    (:class:`~lightning_embark.accounting.DispatchCountCallback`): two before the measured
    ones, so that neither it nor the work it leaves running into the next step (both slowed
    by the count) is measured; the first step when the warm-up is shorter."""
    return max(0, warmup - 2)


def summarize_dispatch(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per rank: the counted step, its counts, and its ``torch.distributed`` calls (the byte
    counter's record of the same step)."""
    rows = []
    for record in records:
        counted = record.get("dispatch")
        if counted is None:
            continue
        step = counted["step"]
        comm = record["comm"][step].get("by_collective", {}) if step < len(record["comm"]) else {}
        rows.append(
            {
                "rank": record["rank"],
                "step": step,
                "counts": counted["counts"],
                "collectives": {name: stats["calls"] for name, stats in comm.items()},
            }
        )
    return rows


def format_dispatch_run(run: str, rows: list[dict[str, Any]]) -> str:
    """A run's counted step: every rank's totals, then rank 0's counts in full."""
    from lightning_embark.accounting import DispatchSnapshot, format_dispatch

    snapshots = [(row, DispatchSnapshot.from_dict(row["counts"])) for row in rows]
    totals = ", ".join(
        f"rank {row['rank']} {s.total_ops} ops / {s.device_syncs} syncs" for row, s in snapshots
    )
    lines = [f"{run}: what a GPU would see of step {rows[0]['step']} ({totals})"]
    lines.append(
        format_dispatch(f"{run}, rank 0", snapshots[0][1], collectives=rows[0]["collectives"])
    )
    return "\n".join(lines)
