"""Host-aware (and optionally compressed) all-reduce of the dense gradients.

DDP's stock all-reduce is one ring over every rank. On a cluster whose hosts are
joined by links ~16x slower than the links inside a host, the dense gradients of a
DLRM-DCNv2 (~16M parameters) then cross hosts ~3x more than they must. This DDP
communication hook reduce-scatters inside each host first (fast links), all-reduces
each local rank's 1/L slice across hosts among same-local-rank peers (slow links),
and all-gathers the slices back inside the host: the cross-host volume of the slice
all-reduce only. Optionally the wire format is bf16 or fp16 (the gradient is
averaged before the cast, so fp16 does not overflow where fp32 would not).

On gloo (CPU) the three stages block, so the hook hands each bucket to one background
thread and returns a future at once: backward computation goes on while buckets cross
the slow link, as with DDP's stock asynchronous all-reduce. One thread, fed in DDP's
bucket order, issues the collectives in the same order on every rank; it uses process
groups of its own, so it never interleaves with the embedding exchange on the main
thread. On NCCL (CUDA) the collectives do not block the host, so no thread is needed:
the hook enqueues the stages on a side stream that first waits for the bucket, and
returns a CUDA-aware future that DDP's stream waits for, so backward's kernels on the
default stream run while the bucket's collectives run on theirs (that path has not run
on a GPU yet).
"""

# No ``from __future__ import annotations`` here: DDP inspects the hook's annotations
# at registration and requires the real ``dist.GradBucket`` class, not a string.
import queue
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from lightning_embark._handover import capture, restored
from lightning_embark._traffic import traffic
from lightning_embark.errors import ConfigError
from lightning_embark.exchange import hierarchy_groups, release_hierarchy_groups, stopped_by
from lightning_embark.plan import Compression

DENSE_EXCHANGES = ("flat", "hierarchical")
#: ``DistributedDataParallel`` arguments of ``EmbarkStrategy``'s dense part unless the user
#: passes their own, as torchrec's ``DistributedModelParallel`` wraps its dense part.
#: DDP's default syncs every buffer from rank 0 at each forward: one more collective across
#: every rank per step, and for a DLRM's interaction the ``triu_indices`` buffer,
#: F (F + 1) int64 values (2.1 MB at 510 tables), which never changes. Buffers are still
#: synced once, at wrapping; a model whose buffers change in training (BatchNorm's running
#: statistics) passes ``forward_sync_buffers=True``. ``gradient_as_bucket_view`` makes the
#: gradients views of DDP's buckets instead of copies into them and back.
DENSE_DDP_DEFAULTS: Mapping[str, Any] = {
    "forward_sync_buffers": False,
    "gradient_as_bucket_view": True,
}
# torch 2.13 renamed the tensor forms of reduce-scatter and all-gather (the old names warn);
# older torch (the CUDA images) has only the old ones. Called through the module, so the
# byte counter sees them.
_REDUCE_SCATTER = (
    "reduce_scatter_single" if hasattr(dist, "reduce_scatter_single") else "reduce_scatter_tensor"
)
_ALL_GATHER = (
    "all_gather_single" if hasattr(dist, "all_gather_single") else "all_gather_into_tensor"
)
_WIRE_DTYPES = {
    Compression.FP32: torch.float32,
    Compression.BF16: torch.bfloat16,
    Compression.FP16: torch.float16,
}


#: A worker's job: takes what stopped the worker (None: nothing) and returns it.
_Job = Callable[[BaseException | None], BaseException | None]


class SerialWorker:
    """One daemon thread running submitted jobs in submission order.

    A daemon, so a job stuck in a collective with a dead peer cannot keep the
    process from exiting; the error surfaces where DDP waits on the future. The
    thread starts with the first job and stops at :meth:`close` (the strategy's
    teardown), so a process that trains one model after another (``embark-tune``'s
    ranks) keeps no thread, and no bucket the thread last saw, per finished run; a
    job submitted after ``close`` starts a new thread.
    """

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def _loop(self) -> None:
        stopped: BaseException | None = None
        while (job := self._jobs.get()) is not None:
            stopped = job(stopped)

    @property
    def running(self) -> bool:
        return self._thread is not None

    def close(self, *, wait: bool = True) -> None:
        """Stop the thread once the jobs submitted so far have run; ``wait=False`` (after
        an error) returns at once, leaving them to the daemon thread (a job may wait in a
        collective for a peer that waits for this rank: see
        :meth:`~lightning_embark.engine._lane.Lane.close`)."""
        if self._thread is None:
            return
        self._jobs.put(None)
        if wait:
            self._thread.join()
        self._thread = None

    def submit(self, fn: Callable[[], torch.Tensor]) -> torch.futures.Future[torch.Tensor]:
        """``fn()``'s result (or exception) as a future, computed on the worker thread under
        the submitting thread's per-thread state (:mod:`lightning_embark._handover`)."""
        future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        handover = capture()

        def job(stopped: BaseException | None) -> BaseException | None:
            """Run ``fn`` unless an earlier job failed because of a peer (then fail with
            that: see :func:`~lightning_embark.exchange.stopped_by`); returns what
            stops the later jobs."""
            if stopped is not None:
                future.set_exception(stopped)  # type: ignore[arg-type]  # torch's stub types it as T
                return stopped
            try:
                with restored(handover):
                    result = fn()
            except BaseException as error:
                future.set_exception(error)  # type: ignore[arg-type]  # torch's stub types it as T
                return stopped_by(error)
            future.set_result(result)
            return None

        if self._thread is None:
            self._thread = threading.Thread(
                target=self._loop, name="embark-dense-allreduce", daemon=True
            )
            self._thread.start()
        self._jobs.put(job)
        return future


@dataclass(kw_only=True)
class DenseAllReduceState:
    """What the hook needs; build it with :func:`dense_allreduce_state` after init."""

    parent_group: Any
    host_group: Any
    local_group: Any
    ranks_per_host: int
    num_hosts: int
    local_rank: int
    world_size: int
    wire_dtype: torch.dtype
    worker: SerialWorker = field(default_factory=SerialWorker)
    #: The CUDA side stream of the NCCL path, made on its first bucket.
    stream: Any = None


def check_dense_options(exchange: str, compression: Compression | str) -> Compression:
    """Validate the strategy's dense-gradient options; returns the compression enum."""
    if exchange not in DENSE_EXCHANGES:
        raise ConfigError(
            f"dense_exchange={exchange!r} is unknown; use one of {list(DENSE_EXCHANGES)}"
        )
    try:
        value = Compression(compression)
    except ValueError:
        raise ConfigError(
            f"dense_compression={compression!r} is unknown; use one of "
            f"{[c.value for c in _WIRE_DTYPES]}"
        ) from None
    if value not in _WIRE_DTYPES:
        raise ConfigError(
            f"dense_compression={value.value!r} is not supported for dense gradients; "
            f"use one of {[c.value for c in _WIRE_DTYPES]}"
        )
    return value


def default_dense_compression(allow: tuple[Compression, ...]) -> Compression:
    """bf16 when the user allows it on the wire, else lossless fp32.

    Only bf16 is picked on the user's behalf: it keeps fp32's exponent range, so
    small averaged gradients do not flush to zero as they can in fp16.
    """
    return Compression.BF16 if Compression.BF16 in allow else Compression.FP32


def dense_allreduce_state(*, ranks_per_host: int, compression: Compression) -> DenseAllReduceState:
    """Build the state on every rank at the same point (it creates its process groups)."""
    world_size = dist.get_world_size()
    # A parent group of our own: hierarchy_groups caches per parent, so these host and
    # local-rank groups are not the ones the embedding exchange uses.
    own = dist.new_group(list(range(world_size)))
    host_group, local_group = hierarchy_groups(ranks_per_host, group=own)
    return DenseAllReduceState(
        parent_group=own,
        host_group=host_group,
        local_group=local_group,
        ranks_per_host=ranks_per_host,
        num_hosts=world_size // ranks_per_host,
        local_rank=dist.get_rank() % ranks_per_host,
        world_size=world_size,
        wire_dtype=_WIRE_DTYPES[compression],
    )


def release_dense_state(state: DenseAllReduceState) -> None:
    """Stop the worker thread and destroy the state's process groups (every rank, at the
    same point); the state cannot be used afterwards."""
    state.worker.close()
    release_hierarchy_groups(state.parent_group)
    dist.destroy_process_group(state.parent_group)


def hierarchical_allreduce(grad: torch.Tensor, state: DenseAllReduceState) -> torch.Tensor:
    """The averaged gradient over all ranks, as a new tensor of ``grad``'s dtype
    (its collectives counted as ``dense`` traffic)."""
    with traffic("dense"):
        return _hierarchical_allreduce(grad, state)


def _hierarchical_allreduce(grad: torch.Tensor, state: DenseAllReduceState) -> torch.Tensor:
    wire = (grad / state.world_size).to(state.wire_dtype).reshape(-1)
    num_hosts, ranks_per_host = state.num_hosts, state.ranks_per_host
    if num_hosts == 1 or ranks_per_host == 1:
        dist.all_reduce(wire, group=state.host_group if num_hosts == 1 else state.local_group)
        return wire.reshape(grad.shape).to(grad.dtype)
    chunk = -(-wire.numel() // ranks_per_host)
    # On the bucket's device: the collectives take tensors where DDP keeps the gradients.
    padded = wire.new_zeros(chunk * ranks_per_host)
    padded[: wire.numel()] = wire
    mine = wire.new_empty(chunk)
    getattr(dist, _REDUCE_SCATTER)(mine, padded, group=state.host_group)
    dist.all_reduce(mine, group=state.local_group)
    getattr(dist, _ALL_GATHER)(padded, mine, group=state.host_group)
    wire = padded[: wire.numel()].reshape(grad.shape)
    return wire.to(grad.dtype)


def hierarchical_allreduce_hook(
    state: DenseAllReduceState, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: :func:`hierarchical_allreduce` of each bucket, in the background."""
    buffer = bucket.buffer()
    if buffer.is_cuda:
        return _on_side_stream(buffer, state)
    return state.worker.submit(lambda: hierarchical_allreduce(buffer, state))


def _on_side_stream(
    buffer: torch.Tensor, state: DenseAllReduceState
) -> torch.futures.Future[torch.Tensor]:
    """:func:`hierarchical_allreduce` of a CUDA bucket, enqueued on the state's side stream.

    The side stream waits for the bucket (backward wrote it on the current stream); the
    bucket is recorded on the side stream (its memory must not be reused before the
    collectives read it); the future is CUDA-aware (``devices=``), so setting its result
    on the side stream records an event there, and whoever waits for the value (DDP) makes
    its own stream wait for that event instead of blocking the host.
    """
    if state.stream is None:
        state.stream = torch.cuda.Stream(buffer.device)
    stream = state.stream
    stream.wait_stream(torch.cuda.current_stream(buffer.device))
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future(devices=[buffer.device])
    with torch.cuda.stream(stream):
        buffer.record_stream(stream)
        future.set_result(hierarchical_allreduce(buffer, state))
    return future
