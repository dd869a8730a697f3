"""Fixtures of the emulated-cluster tests: job scripts and a leftover-namespace guard."""

from __future__ import annotations

import os
import re
import textwrap
from pathlib import Path

import pytest

from lightning_embark.emulation._netns import (
    delete_namespace,
    list_namespaces,
    netns_unavailable_reason,
)

# Every namespace a test creates starts with this, so the guard below can tell them
# from a cluster somebody else runs on the machine at the same time.
TEST_PREFIX = "embtest-"

# A tiny gloo job: all_reduce, world size 4, and a JSON record per rank of where it ran.
GLOO_JOB = textwrap.dedent(
    """
    import json, os, socket, sys
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    value = torch.tensor([float(rank)])
    dist.all_reduce(value)
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    probe.connect((os.environ["MASTER_ADDR"], 9))  # no packet is sent: picks the source address
    record = {
        "rank": rank,
        "world": world,
        "sum": value.item(),
        "host": rank // int(os.environ["EMBARK_RANKS_PER_HOST"]),
        "group_rank": int(os.environ["GROUP_RANK"]),
        "ifname": os.environ["GLOO_SOCKET_IFNAME"],
        "address": probe.getsockname()[0],
        "netns": os.readlink("/proc/self/ns/net"),
        "mode": os.environ["EMBARK_CLUSTER_MODE"],
        "num_hosts": int(os.environ["EMBARK_NUM_HOSTS"]),
        "rate": os.environ["EMBARK_INTER_HOST_RATE_MBIT"],
    }
    with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as fh:
        json.dump(record, fh)
    # One rank at a time: ranks of one host share torchrun's pipe, and
    # concurrent prints may interleave mid-line.
    for turn in range(world):
        if turn == rank:
            print(f"rank {rank} of {world} done", flush=True)
        dist.barrier()
    dist.destroy_process_group()
    """
)

# No torch import (fast): every rank records its pid, says "ready", then waits;
# rank FAIL_RANK (if given) exits with status 3.
SLEEP_JOB = textwrap.dedent(
    """
    import os, sys, time
    rank = int(os.environ["RANK"])
    with open(os.path.join(sys.argv[1], f"pid{rank}"), "w") as fh:
        fh.write(str(os.getpid()))
    print(f"rank {rank} ready", flush=True)
    if len(sys.argv) > 2 and rank == int(sys.argv[2]):
        time.sleep(0.5)
        sys.exit(3)
    time.sleep(300)
    """
)


@pytest.fixture
def prefix() -> str:
    """Namespace name prefix for clusters created by tests."""
    return TEST_PREFIX


@pytest.fixture
def gloo_job(tmp_path: Path) -> tuple[Path, Path]:
    """(script, output folder) of the gloo job."""
    script, out = tmp_path / "gloo_job.py", tmp_path / "out"
    script.write_text(GLOO_JOB)
    out.mkdir()
    return script, out


@pytest.fixture
def sleep_job(tmp_path: Path) -> tuple[Path, Path]:
    """(script, pid folder) of the sleeping job."""
    script, out = tmp_path / "sleep_job.py", tmp_path / "pids"
    script.write_text(SLEEP_JOB)
    out.mkdir()
    return script, out


def _ours() -> set[str]:
    """The test namespaces of this process, or of a process that has ended (a launcher the
    test started and killed); those of another live process (a test run beside this one
    on the machine) are not this test's to judge or remove."""
    if netns_unavailable_reason() is not None:
        return set()
    ours = set()
    for ns in list_namespaces():
        if not ns.startswith(TEST_PREFIX):
            continue
        owner = re.match(r"(?:up)?(\d+)-", ns[len(TEST_PREFIX) :])
        pid = int(owner.group(1)) if owner else None
        if pid is None or pid == os.getpid() or not _alive(pid):
            ours.add(ns)
    return ours


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@pytest.fixture(autouse=True)
def no_leftover_namespaces():
    """Fail a test that leaves namespaces behind, and remove them anyway."""
    before = _ours()
    yield
    leftovers = _ours() - before
    if leftovers:
        for ns in sorted(leftovers):
            delete_namespace(ns)
        pytest.fail(f"namespaces left behind: {sorted(leftovers)}")
