"""Helpers for tests and benchmarks that run several gloo ranks on one CPU machine.

Ranks start from a fork server, never from the caller. Forking the caller (a pytest
process that has run Lightning, the engine's worker threads and gloo groups) copies a
multi-threaded process into one that has only the forking thread: a lock another thread
held stays held, a pool's threads are gone, and the rank can hang in its first
collective or at exit. The fork server is a fresh interpreter, started once per process
(:mod:`multiprocessing.forkserver`), that imports :data:`PRELOAD` and nothing else runs in
it; every rank is a fork of that single-threaded server, so it starts in a fraction of a
second instead of the seconds a spawned interpreter takes to import torch.

What a rank needs from the caller travels explicitly: the function and its arguments
(pickled; functions by module and name), the caller's environment, working directory,
``sys.path`` and its stdout and stderr as they are at the call (a test that captures the
ranks' output sees it), and the modules the caller loaded by path with :func:`load_module`
(loaded again by path in the rank, before anything that refers to them is unpickled).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import multiprocessing
import multiprocessing.context
import os
import socket
import sys
import traceback
import types
from collections.abc import Callable
from multiprocessing import reduction
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

#: What the fork server imports before it forks its first rank (what nearly every test
#: rank imports; a module it lacks is imported by the rank itself).
PRELOAD = (
    "torch",
    "torch.distributed",
    "lightning.pytorch",
    "torchrec",
    "pytest",
    "lightning_embark.strategies",
    "lightning_embark.torchrec_modules",
    "lightning_embark.testing",
)

#: Modules :func:`load_module` loaded in this process: name -> file.
_BY_PATH: dict[str, str] = {}


def load_module(path: str | Path, name: str) -> ModuleType:
    """The Python file at ``path`` as module ``name``, loaded once per process.

    For scripts outside any package (``benchmarks/``, ``examples/``, test helpers).
    The module is registered in ``sys.modules`` before it runs, because dataclasses
    look their defining module up there. Ranks of :func:`run_gloo_ranks` load it too
    (by the same path, under the same name), so its functions and classes can be sent
    to them.
    """
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    for parent in _parents(name):
        if parent not in sys.modules:  # a dotted name outside any package on sys.path
            placeholder = types.ModuleType(parent)
            placeholder.__path__ = []
            sys.modules[parent] = placeholder
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    _BY_PATH[name] = str(path)
    return module


def _parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _module_by_path(name: str, path: str) -> ModuleType:
    """The module ``name`` (a module object sent to a rank): imported, or loaded by path."""
    if name in sys.modules:
        return sys.modules[name]
    return load_module(path, name)


def _reduce_module(module: ModuleType) -> tuple[Any, tuple[str, str]]:
    path = getattr(module, "__file__", None)
    if path is None:
        raise TypeError(f"module {module.__name__!r} has no file; it cannot be sent to a rank")
    return _module_by_path, (module.__name__, path)


# Tests hand helper modules (loaded by path) to their ranks as arguments.
ForkingPickler.register(types.ModuleType, _reduce_module)


class _Modules:
    """Unpickled before the rank's function and arguments: loads, by path, the modules
    they refer to that the rank could not import by name."""

    def __init__(self, modules: dict[str, str]) -> None:
        self.modules = modules

    def __reduce__(self) -> tuple[Any, tuple[dict[str, str]]]:
        return _load_modules, (self.modules,)


class _Streams:
    """The caller's stdout and stderr as they are now, for the rank's (the fork server's are
    those of whatever test started it, e.g. a capture file long closed).

    Pickled while the rank is being started, so multiprocessing sends the two descriptors
    along (``reduction.DupFd``); unpickled first in the rank, which writes to them.
    """

    def __reduce__(self) -> tuple[Any, tuple[Any, Any]]:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(AttributeError, ValueError, OSError):
                stream.flush()
        return _attach_streams, (reduction.DupFd(1), reduction.DupFd(2))


def _attach_streams(out: Any, err: Any) -> _Streams:
    for target, dup in ((1, out), (2, err)):
        fd = dup.detach()
        os.dup2(fd, target)
        os.close(fd)
    return _Streams()


def _load_modules(modules: dict[str, str]) -> _Modules:
    for name, path in modules.items():
        if name in sys.modules:
            continue
        try:
            importlib.import_module(name)
        except ImportError:
            load_module(path, name)
    return _Modules(modules)


def _needed_modules(fn: Callable[..., Any], args: tuple) -> dict[str, str]:
    """The modules the rank must have before it unpickles ``fn`` and ``args``: ``fn``'s own
    (a test module, imported by name where it can be) and those, loaded here by path, of
    the modules, functions, classes and objects among ``args``."""
    names = {getattr(fn, "__module__", "")} | _modules_in(args)
    needed = {}
    for name in names:
        module = sys.modules.get(name)
        path = getattr(module, "__file__", None)
        if module is not None and path is not None and name != "__main__":
            needed[name] = _BY_PATH.get(name, path)
    return needed


def _modules_in(value: Any) -> set[str]:
    """The names of the modules ``value`` refers to (through tuples, lists, dicts and
    dataclasses)."""
    if isinstance(value, ModuleType):
        return {value.__name__}
    if isinstance(value, list | tuple | set):
        return set().union(*(_modules_in(v) for v in value))
    if isinstance(value, dict):
        return set().union(*(_modules_in(v) for v in (*value.keys(), *value.values())))
    if callable(value) and hasattr(value, "__module__"):  # a function or a class
        return {value.__module__}
    found = {type(value).__module__}
    if dataclasses.is_dataclass(value):
        found |= set().union(
            *(_modules_in(getattr(value, f.name)) for f in dataclasses.fields(value))
        )
    return found


def rank_context() -> multiprocessing.context.BaseContext:
    """The multiprocessing context ranks start from (the fork server, with :data:`PRELOAD`);
    queues and events shared with ranks come from it (``rank_context().Queue()``)."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(PRELOAD))  # takes effect when the server starts
    return context


def free_port() -> int:
    """A TCP port that was free a moment ago on localhost."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _entry(
    rank: int,
    streams: _Streams,
    modules: _Modules,
    fn: Callable[..., Any],
    world_size: int,
    port: int,
    environ: dict[str, str],
    args: tuple,
) -> None:
    del streams, modules  # attached and loaded while the arguments were unpickled
    os.environ.clear()
    os.environ.update(environ)
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
        # Lightning's launcher gives each process cpu_count / processes intra-op threads
        # unless OMP_NUM_THREADS is set; the ranks share the machine's cores.
        OMP_NUM_THREADS="1",
    )
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        fn(rank, world_size, *args)
        dist.barrier()
    except BaseException:
        traceback.print_exc()
        raise
    finally:
        dist.destroy_process_group()


def run_gloo_ranks(fn: Callable[..., Any], world_size: int, *args: Any) -> None:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` gloo ranks forked from the fork
    server (see the module docstring).

    ``fn`` must be a module-level function (a test module's is fine) and ``args``
    picklable; modules (a helper loaded with :func:`load_module`) may be among them. A
    failure on any rank fails the call with that rank's traceback printed. Whatever ends
    the wait (a rank's failure, the test's timeout interrupting it), no rank is left
    running: a hung rank would outlive the test and hold its output pipe open.
    """
    rank_context()
    process_context = mp.start_processes(
        _entry,
        args=(
            _Streams(),
            _Modules(_needed_modules(fn, args)),
            fn,
            world_size,
            free_port(),
            dict(os.environ),
            args,
        ),
        nprocs=world_size,
        join=False,
        start_method="forkserver",
    )
    assert process_context is not None
    try:
        while not process_context.join():
            pass
    finally:
        for process in process_context.processes:
            if process.is_alive():
                process.kill()
                process.join()
