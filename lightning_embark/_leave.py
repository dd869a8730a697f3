"""How a rank program ends: its process groups freed while every peer is still there."""

from __future__ import annotations

import gc

import torch.distributed as dist


def leave_process_groups() -> None:
    """Free every process group of a finished run before the interpreter's exit, the default
    one last, once every rank has freed its others (every rank calls it at the same point,
    after a run that did not fail).

    A group still alive at the exit is freed in the interpreter's teardown while its peers
    exit and close their connections: there a rank can abort on a gloo thread ("terminate
    called without an active exception"; torchrec keeps its intra- and cross-host groups in
    module globals, DDP's reducer holds the default one), and under torchrun the other
    node's agent then waits out its exit barrier. So: drop the run's reference cycles
    (they hold its sharded modules and their groups), meet at a barrier, and destroy the
    default group while every peer is still connected.
    """
    gc.collect()
    if dist.is_initialized():
        dist.barrier()  # no rank closes its connections before every rank freed its groups
        dist.destroy_process_group()
        gc.collect()
