"""Helpers for tests and benchmarks that run several gloo ranks on one CPU machine."""

from __future__ import annotations

import gc
import importlib.util
import os
import socket
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def load_module(path: str | Path, name: str) -> ModuleType:
    """The Python file at ``path`` as module ``name``, loaded once per process.

    For scripts outside any package (``benchmarks/``, ``examples/``, test helpers).
    The module is registered in ``sys.modules`` before it runs, because dataclasses
    look their defining module up there.
    """
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def free_port() -> int:
    """A TCP port that was free a moment ago on localhost."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _entry(rank: int, fn: Callable[..., Any], world_size: int, port: int, args: tuple) -> None:
    # Objects inherited from the parent are never collected here: a process group the
    # parent had dropped into a reference cycle would run its destructor in this process,
    # which joins worker threads that do not exist after the fork, and hang.
    gc.freeze()
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
        # Lightning's launcher gives each process cpu_count / processes intra-op threads
        # unless OMP_NUM_THREADS is set; a forked rank that starts an OpenMP team hangs
        # in libgomp if the parent had one (its pool's threads do not survive the fork).
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
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` forked gloo ranks.

    Forking (not spawning) lets tests pass closures and test-module functions. Two
    hazards of forking a process that has run torch are closed: the parent's garbage is
    collected first and the children never collect what they inherit (a dropped gloo
    process group's destructor would hang there), and each rank runs one OpenMP thread
    (libgomp's pool does not survive a fork; Lightning would start one). A
    failure on any rank fails the call with that rank's traceback printed. Whatever
    ends the wait (a rank's failure, the test's timeout interrupting it), no rank is
    left running: a hung rank would outlive the test and hold its output pipe open.
    """
    gc.collect()  # nothing the parent left for its collector is inherited (see ``_entry``)
    context = mp.start_processes(
        _entry,
        args=(fn, world_size, free_port(), args),
        nprocs=world_size,
        join=False,
        start_method="fork",
    )
    assert context is not None
    try:
        while not context.join():
            pass
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
                process.join()
