"""Launching one torchrun per emulated host and supervising them as one job.

A job on several hosts fails as a whole: when one host's torchrun fails, the supervisor
gives the other hosts :data:`FAILURE_GRACE_S` to end on their own, then stops what is
left. A rank whose peer died raises a :class:`~lightning_embark.errors.PeerError` saying
which within a few seconds (and ``embark-tune``'s ranks write it down for the trial), so
the grace lets the survivors tell; a rank stuck elsewhere would otherwise wait for gloo's
30-minute timeout. Each torchrun gets a session (process group) of its own so a Ctrl-C
in the terminal reaches only this supervisor, which then stops every host at once (see
:mod:`lightning_embark.emulation._procs`).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from lightning_embark.emulation._netns import kill_namespace_processes
from lightning_embark.emulation._procs import (
    parent_death_signal_setter,
    signals_deferred,
    terminate_trees,
)
from lightning_embark.errors import EmulationError

_POLL_S = 0.05
#: How long the other hosts of a failed job may take to end on their own (seconds).
FAILURE_GRACE_S = 10.0


@dataclass(frozen=True)
class HostLaunch:
    """One process to start for a job: usually ``ip netns exec <ns> torchrun ...``.

    Attributes:
        label: Prefix of its output lines, e.g. ``[host 1]``.
        argv: The command.
        env: Its full environment.
        namespace: The network namespace it runs in, if any; everything left in it
            is killed when the job ends.
    """

    label: str
    argv: list[str]
    env: dict[str, str] = field(repr=False)
    namespace: str | None = None


def torchrun_argv(
    *,
    python: str,
    nnodes: int,
    node_rank: int,
    nproc_per_node: int,
    master_addr: str,
    master_port: int,
    argv: Sequence[str],
) -> list[str]:
    """The ``python -m torch.distributed.run`` command of one node (static rendezvous)."""
    return [
        python,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        str(nnodes),
        "--node-rank",
        str(node_rank),
        "--nproc-per-node",
        str(nproc_per_node),
        "--master-addr",
        master_addr,
        "--master-port",
        str(master_port),
        *argv,
    ]


#: Extra environment for measuring jobs: one intra-op thread per rank (the ranks of
#: every emulated host share the machine's cores, so more threads only contend) and
#: torch's C++ log at ``ERROR`` (its per-rank gloo notices would drown the report).
QUIET_RANK_ENV: dict[str, str] = {"OMP_NUM_THREADS": "1", "TORCH_CPP_LOG_LEVEL": "ERROR"}


def rank_env(
    *,
    extra: dict | None,
    ifname: str,
    mode: str,
    num_hosts: int,
    ranks_per_host: int,
    rate_mbit: float | None,
    describe: str,
) -> dict[str, str]:
    """The environment of a host's torchrun, inherited by its ranks.

    Ours, then ``extra``, then the cluster's variables, which always win:

    - ``GLOO_SOCKET_IFNAME`` (and ``TP_``/``NCCL_SOCKET_IFNAME``): the host's
      interface, so collectives use the host's address and, between hosts, its
      shaped link.
    - ``EMBARK_NUM_HOSTS``, ``EMBARK_RANKS_PER_HOST``: the rank->host map
      (rank ``r`` is on host ``r // EMBARK_RANKS_PER_HOST``), also in loopback.
    - ``EMBARK_CLUSTER_MODE``: ``netns`` or ``loopback``.
    - ``EMBARK_INTER_HOST_RATE_MBIT``: the shaped rate, ``0`` when not shaped.
    - ``EMBARK_CLUSTER_DESCRIBE``: the cluster's one-line label for reports.
    """
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.update({str(k): str(v) for k, v in (extra or {}).items()})
    env.update(
        GLOO_SOCKET_IFNAME=ifname,
        TP_SOCKET_IFNAME=ifname,
        NCCL_SOCKET_IFNAME=ifname,
        EMBARK_NUM_HOSTS=str(num_hosts),
        EMBARK_RANKS_PER_HOST=str(ranks_per_host),
        EMBARK_CLUSTER_MODE=mode,
        EMBARK_INTER_HOST_RATE_MBIT=f"{rate_mbit or 0:g}",
        EMBARK_CLUSTER_DESCRIBE=describe,
    )
    return env


def free_loopback_port() -> int:
    """A TCP port free on 127.0.0.1 right now (for the loopback rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _pump(stream, label: str | None, lock: threading.Lock) -> None:
    """Copy a child's output to our stdout line by line, prefixed with its label."""
    for raw in iter(stream.readline, b""):
        line = raw.decode("utf-8", errors="replace")
        if not line.endswith("\n"):
            line += "\n"
        with lock:
            out = sys.stdout
            out.write(f"{label} {line}" if label else line)
            out.flush()
    stream.close()


def run_job(launches: Sequence[HostLaunch], *, log_prefix: bool = True) -> int:
    """Start every launch, stream their output, and wait for all of them.

    Returns:
        0 when every process succeeded; otherwise the exit status of the first
        one that failed (the others are stopped :data:`FAILURE_GRACE_S` later if they
        have not ended by then).

    Raises:
        EmulationError: A process could not be started.
        KeyboardInterrupt, SystemExit: After every process was killed.
    """
    lock = threading.Lock()
    procs: list[subprocess.Popen] = []
    pumps: list[threading.Thread] = []
    first_failure = 0
    finished = False
    try:
        preexec = parent_death_signal_setter()
        for launch in launches:
            try:
                proc = subprocess.Popen(
                    launch.argv,
                    env=launch.env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE if log_prefix else None,
                    stderr=subprocess.STDOUT if log_prefix else None,
                    start_new_session=True,
                    preexec_fn=preexec,
                )
            except OSError as exc:
                raise EmulationError(
                    f"could not start {launch.label} `{' '.join(launch.argv)}`: {exc}"
                ) from exc
            procs.append(proc)
        # Reader threads start after every fork, so no thread holds a lock while we fork.
        if log_prefix:
            for launch, proc in zip(launches, procs, strict=False):
                pump = threading.Thread(
                    target=_pump, args=(proc.stdout, launch.label, lock), daemon=True
                )
                pump.start()
                pumps.append(pump)
        pending = set(range(len(procs)))
        while pending and not first_failure:
            for index in sorted(pending):
                code = procs[index].poll()
                if code is None:
                    continue
                pending.discard(index)
                if code != 0:
                    first_failure = code
                    with lock:
                        print(
                            f"{launches[index].label} exited with status {code}; the other "
                            f"hosts get {FAILURE_GRACE_S:g} s to end, then are stopped",
                            file=sys.stderr,
                            flush=True,
                        )
                    break
            time.sleep(_POLL_S)
        finished = not first_failure
        deadline = time.monotonic() + FAILURE_GRACE_S
        while first_failure and time.monotonic() < deadline:
            if all(proc.poll() is not None for proc in procs):
                break
            time.sleep(_POLL_S)
    finally:
        with signals_deferred():
            terminate_trees(procs)
            if not finished:
                # Orphans reparented away from torchrun are still inside the namespace.
                for launch in launches:
                    if launch.namespace is not None:
                        kill_namespace_processes(launch.namespace)
            for pump in pumps:
                pump.join(timeout=2.0)
    return first_failure
