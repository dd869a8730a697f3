"""Host work on purpose: code that reads or makes host tensors whatever the engine's device.

The dispatch counter (:mod:`lightning_embark.accounting`) decides by op whether a call
would stall a GPU's stream: on a CPU run every tensor is a host tensor, so reading one
(``int(t)``, ``t.tolist()``) looks the same whether ``t`` would live on the GPU or is a
host tensor by design. Code that is host work whatever the device marks itself with
:func:`host_work` (or :func:`host_only` on a function), and the counter reports its
reads apart, as host work a GPU run does not make or that does not wait for the GPU:

* branches taken for CPU tensors only (``if x.device.type == "cpu"``: e.g. the codecs'
  finiteness proof, whose sync costs nothing on a CPU);
* tables built on the host from Python layouts, then copied to the device once and
  cached (the kernels' index tables);
* host data a step sends to the device (:func:`to_device`: made on the host, pinned and
  copied without waiting, so the stream is not stalled).

The mark is per thread and nests; it changes nothing but what the counter reports.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ParamSpec, TypeVar

import torch
from torch import Tensor

_local = threading.local()

P = ParamSpec("P")
R = TypeVar("R")


@contextlib.contextmanager
def host_work() -> Iterator[None]:
    """Inside the block, this thread's tensor reads are host work (see the module docstring)."""
    _local.depth = getattr(_local, "depth", 0) + 1
    try:
        yield
    finally:
        _local.depth -= 1


def host_only(fn: Callable[P, R]) -> Callable[P, R]:
    """``fn`` runs as :func:`host_work` (a function called on host tensors only)."""

    @functools.wraps(fn)
    def marked(*args: P.args, **kwargs: P.kwargs) -> R:
        # The increments inline: the codecs call it once per block.
        _local.depth = getattr(_local, "depth", 0) + 1
        try:
            return fn(*args, **kwargs)
        finally:
            _local.depth -= 1

    return marked


def in_host_work() -> bool:
    """Whether this thread is inside :func:`host_work`."""
    return getattr(_local, "depth", 0) > 0


def to_device(values: Sequence[Any], *, dtype: torch.dtype, device: torch.device) -> Tensor:
    """Python ``values`` as a ``dtype`` tensor on ``device``, queued rather than waited for.

    ``torch.tensor(values, device=cuda)`` copies from pageable memory with ATen's
    ``memcpy_and_sync``: the host waits for everything already queued on the stream. Made
    on the host (host work), pinned, and copied with ``non_blocking=True``, the copy is
    queued behind the stream's work and the host goes on; the caching host allocator keeps
    the pinned buffer until the copy has run (it records an event on the stream). On the
    CPU the host tensor is the result.
    """
    with host_work():
        host = torch.tensor(values, dtype=dtype, device="cpu")
    if device.type == "cpu":
        return host
    if device.type == "cuda":
        host = host.pin_memory()
    return host.to(device, non_blocking=True)
