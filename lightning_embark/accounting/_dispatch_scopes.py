"""Scopes for the dispatch counter: which embedding cluster and direction an op belongs to.

:func:`scope_clusters` wraps the cluster objects of every embedding engine under a module
(instance attributes over their methods, so the engine stays unaware of them), and
:func:`scope_sharded_modules` torchrec's sharded modules' phases, so that
:class:`~._dispatch.DispatchCounter` reports ops, syncs and collectives per scope:

* ``<cluster>:forward`` - the cluster's forward (its input distribution run inside the
  step included) and the lane work it queues (its rows exchange and pooling);
* ``<cluster>:ahead`` - its input distribution run a step ahead by the input pipeline;
* ``<cluster>:backward`` - its backward: the gradients' encoding here, their exchange and
  the owners' update on the lane;
* ``<module class>:<phase>`` for torchrec's sharded modules: ``input_dist``, ``compute``,
  ``output_dist``, ``compute_and_output_dist`` (torchrec's backward runs in autograd,
  outside them);
* everything else is :data:`~._dispatch.OUTSIDE` (the dense model, the engine's checks and
  output assembly, the optimizer, the training loop).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from lightning_embark.accounting._dispatch import scope

_SHARDED_PHASES = ("input_dist", "compute", "output_dist", "compute_and_output_dist")


def engine_clusters(root: Any) -> list[Any]:
    """The cluster objects of every embedding engine under the module ``root``.

    Reads the engine's private ``_clusters`` (``[(cluster, positions)]``): the one
    place the engine keeps them.
    """
    found: list[Any] = []
    for module in root.modules():
        for entry in getattr(module, "_clusters", None) or ():
            cluster = entry[0] if isinstance(entry, tuple) else entry
            if hasattr(cluster, "name") and all(c is not cluster for c in found):
                found.append(cluster)
    return found


def _scoped(method: Callable[..., Any], name: Callable[..., str]) -> Callable[..., Any]:
    @functools.wraps(method)
    def scoped(*args: Any, **kwargs: Any) -> Any:
        with scope(name(*args, **kwargs)):
            return method(*args, **kwargs)

    return scoped


def scope_clusters(root: Any) -> list[str]:
    """Scope every engine cluster's ops under ``root`` (idempotent); returns their names."""
    names = []
    for cluster in engine_clusters(root):
        name = str(cluster.name)
        names.append(name)
        if getattr(cluster, "_embark_dispatch_scoped", False):
            continue
        cluster.start_forward = _scoped(
            cluster.start_forward, lambda *a, n=name, **k: f"{n}:forward"
        )
        if hasattr(cluster, "distribute"):
            cluster.distribute = _scoped(
                cluster.distribute,
                lambda *a, n=name, **k: f"{n}:{'ahead' if k.get('ahead') else 'forward'}",
            )
        cluster.start_backward = _scoped(
            cluster.start_backward, lambda *a, n=name, **k: f"{n}:backward"
        )
        cluster._embark_dispatch_scoped = True
    return names


def scope_sharded_modules(root: Any) -> list[str]:
    """Scope the phases of every torchrec sharded module under ``root`` (anything with
    ``input_dist``, ``compute`` and ``output_dist``; idempotent); returns their classes'
    names."""
    names = []
    for module in root.modules():
        if not all(callable(getattr(module, p, None)) for p in _SHARDED_PHASES[:3]):
            continue
        names.append(type(module).__name__)
        if getattr(module, "_embark_dispatch_scoped", False):
            continue
        for phase in _SHARDED_PHASES:
            method = getattr(module, phase, None)
            if callable(method):
                label = f"{type(module).__name__}:{phase}"
                object.__setattr__(module, phase, _scoped(method, lambda *a, s=label, **k: s))
        object.__setattr__(module, "_embark_dispatch_scoped", True)
    return names
