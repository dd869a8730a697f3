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
  cached (the kernels' index tables).

The mark is per thread and nests; it changes nothing but what the counter reports.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator
from typing import ParamSpec, TypeVar

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
