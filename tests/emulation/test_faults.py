"""Faults on the emulated cluster under ``strategy="embark"``'s defaults (the overlapped lane,
the input pipeline): a killed rank, a resume, a lossy link, a bad batch.

2 emulated hosts of 2 ranks, 1 for the bad batches (network namespaces, as
``embark-cluster`` makes them); every rank is its own process started in its host's
namespace (``fault_job.py``, no torchrun: torchrun stops a host's other ranks when one
fails, which would hide what the survivors do). The uninterrupted run on a clean link is
the reference: a run resumed from the checkpoint before a kill, and a run over a link that
drops and delays packets, must equal it bit for bit (the same arithmetic in the same order;
only timing differs). Each test prints how long the job took to end cleanly after its
fault.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from lightning_embark.emulation import QUIET_RANK_ENV, EmulatedHosts, EmulationConfig
from lightning_embark.emulation import _netns as netns
from lightning_embark.emulation._hosts import NETNS_MASTER_PORT
from lightning_embark.errors import EmulationError

REASON = netns.netns_unavailable_reason()
pytestmark = [
    pytest.mark.netns,
    pytest.mark.multiprocess,
    pytest.mark.skipif(REASON is not None, reason=f"needs network namespaces: {REASON}"),
]

JOB = Path(__file__).resolve().parent / "fault_job.py"
DELAY_LINE = JOB.with_name("delay_line.py")
#: Not conftest's prefix: a leftover guard of another test run on the machine (one that
#: takes every ``embtest-`` namespace for its own) must not remove these mid-job. This
#: module checks its own leftovers (:func:`_cluster`).
PREFIX = "embfault-"
HOSTS = 2
EPOCHS = 4  # one step each, a checkpoint after each
#: How long the survivors of a killed rank may take to end.
EXIT_S = 30.0
#: How long a whole job may take before the test calls it hung.
JOB_S = 240.0


@contextlib.contextmanager
def _cluster(per_host: int = 2, **link: Any) -> Iterator[EmulatedHosts]:
    config = EmulationConfig(num_hosts=HOSTS, ranks_per_host=per_host, name_prefix=PREFIX, **link)
    with EmulatedHosts(config, require_netns=True) as cluster:
        yield cluster
        for host in cluster.hosts:  # nothing of the jobs is left in any host
            assert netns.namespace_pids(host.namespace) == [], host.namespace
    left = [ns for ns in netns.list_namespaces() if ns.startswith(cluster.name)]
    assert not left, f"namespaces left behind: {left}"


def _run(cluster: EmulatedHosts, out: Path, *args: str) -> dict[int, dict[str, Any]]:
    """One job: every rank started in its host's namespace, waited for until it ends on
    its own (killed at ``JOB_S``: a hang fails the test, with every thread's stack of each
    hung rank in its log). Returns each rank's exit status,
    time of exit and its record (None for a rank that wrote none)."""
    out.mkdir(parents=True, exist_ok=True)
    world, per_host = cluster.config.world_size, cluster.config.ranks_per_host
    procs = {}
    for rank in range(world):
        host = rank // per_host
        env = cluster.job_env(host, QUIET_RANK_ENV) | {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank % per_host),
            "WORLD_SIZE": str(world),
            "LOCAL_WORLD_SIZE": str(per_host),
            "NODE_RANK": str(host),
            "GROUP_RANK": str(host),
            "MASTER_ADDR": cluster.hosts[0].address,
            "MASTER_PORT": str(NETNS_MASTER_PORT),
        }
        argv = ["ip", "netns", "exec", cluster.hosts[host].namespace, sys.executable]
        with (out / f"log{rank}.txt").open("w") as log:
            procs[rank] = subprocess.Popen(
                [*argv, str(JOB), "--out", str(out), *args],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
    ended: dict[int, float] = {}
    deadline = time.monotonic() + JOB_S
    try:
        while len(ended) < world and time.monotonic() < deadline:
            for rank, proc in procs.items():
                if rank not in ended and proc.poll() is not None:
                    ended[rank] = time.time()
            time.sleep(0.02)
    finally:
        alive = [proc for proc in procs.values() if proc.poll() is None]
        for proc in alive:  # every thread's stack into its log (fault_job's faulthandler)
            proc.send_signal(signal.SIGUSR1)
        if alive:
            time.sleep(2.0)
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    hung = sorted(set(procs) - set(ended))
    assert not hung, f"ranks {hung} still ran after {JOB_S:g} s: {_logs(out)}"
    results = {}
    for rank, proc in procs.items():
        path = out / f"rank{rank}.json"
        record = json.loads(path.read_text()) if path.exists() else None
        results[rank] = {"code": proc.returncode, "ended": ended[rank], "record": record}
    return results


def _logs(out: Path) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(out.glob("log*")))


def _finished(results: dict[int, dict[str, Any]], out: Path) -> None:
    for rank, result in results.items():
        assert result["code"] == 0 and result["record"]["error"] is None, (rank, _logs(out))


def _same_weights(a: Path, b: Path) -> None:
    for rank in range(2 * HOSTS):
        left = torch.load(a / f"weights{rank}.pt")
        right = torch.load(b / f"weights{rank}.pt")
        assert left.keys() == right.keys()
        for key in left:
            assert torch.equal(left[key], right[key]), (rank, key)


def _losses(out: Path) -> list[list[float]]:
    return [json.loads((out / f"rank{r}.json").read_text())["losses"] for r in range(2 * HOSTS)]


@pytest.fixture(scope="module")
def clean() -> Iterator[EmulatedHosts]:
    """2 hosts of 2 ranks with a clean link (the shaped rate, no loss, no added delay)."""
    with _cluster() as cluster:
        yield cluster


@pytest.fixture(scope="module")
def small() -> Iterator[EmulatedHosts]:
    """2 hosts of 1 rank (fewer interpreters to start, for the bad batches)."""
    with _cluster(per_host=1) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def uninterrupted(clean: EmulatedHosts, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("uninterrupted")
    _finished(_run(clean, out, "--epochs", str(EPOCHS)), out)
    return out


@pytest.fixture(scope="module")
def killed(clean: EmulatedHosts, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Rank 1 (host 0) SIGKILLs itself after epoch 2's step, one step past a checkpoint."""
    out = tmp_path_factory.mktemp("killed")
    results = _run(clean, out, "--epochs", str(EPOCHS), "--die-at", "2")
    (out / "results.json").write_text(json.dumps(results))
    return out


def test_a_killed_rank_ends_every_other_rank_with_a_peer_error_naming_it(killed: Path) -> None:
    results = {int(r): v for r, v in json.loads((killed / "results.json").read_text()).items()}
    died = json.loads((killed / "died.json").read_text())
    assert died["rank"] == 1
    assert results[1]["code"] == -9 and results[1]["record"] is None
    for rank in (0, 2, 3):
        result = results[rank]
        after = result["ended"] - died["time"]
        raised = result["record"]["failed_at"] - died["time"]
        print(f"rank {rank}: raised {raised:.1f} s, ended {after:.1f} s after rank 1 was killed")
        assert after < EXIT_S, (rank, after)
        assert result["code"] == 1, (rank, result["code"], _logs(killed))  # no abort at exit
        error = result["record"]["error"]
        assert error["type"] == "PeerError", (rank, error)
        assert "rank 1 on host 0" in error["message"], error["message"]


def test_resumed_from_the_checkpoint_before_the_kill_equals_the_uninterrupted_run(
    clean: EmulatedHosts, killed: Path, uninterrupted: Path, tmp_path: Path
) -> None:
    """Resumed from epoch 1's checkpoint (the last before the kill): epochs 2 and 3 give the
    uninterrupted run's losses and final weights bit for bit, so the checkpoint holds the
    backward updates that were still on the lane when it was written."""
    last = sorted((killed / "checkpoints").iterdir())[-1]
    assert last.name == "epoch=1-step=2.ckpt", sorted(p.name for p in last.parent.iterdir())
    started = time.monotonic()
    args = ("--epochs", str(EPOCHS), "--resume", str(last))
    _finished(_run(clean, tmp_path, *args), tmp_path)
    print(f"resumed run: {time.monotonic() - started:.1f} s")
    for resumed, straight in zip(_losses(tmp_path), _losses(uninterrupted), strict=True):
        assert resumed == straight[2:], (resumed, straight)
    _same_weights(tmp_path, uninterrupted)


#: The impaired link: netem's ``delay 20ms 10ms loss 1%`` on every host's link.
LOSSY = {"delay_ms": 20.0, "jitter_ms": 10.0, "loss_percent": 1.0}


def _has_netem() -> bool:
    try:
        with _cluster(delay_ms=1.0):
            return True
    except EmulationError as error:
        if "netem" not in str(error):
            raise
        return False


@contextlib.contextmanager
def _lossy_cluster() -> Iterator[tuple[EmulatedHosts, str]]:
    """The cluster with every host's link impaired as :data:`LOSSY` says: by tc netem, or
    where the kernel has no netem by ``delay_line.py`` carrying the frames in the switch
    namespace (see there). Yields the cluster and which of the two impairs it."""
    if _has_netem():
        with _cluster(**LOSSY) as cluster:
            yield cluster, "tc netem"
        return
    with _cluster() as cluster:
        for host in cluster.hosts:
            netns.run_cmd(
                ["ip", "-n", cluster.switch, "link", "set", host.switch_ifname, "nomaster"],
                what="taking the host off the bridge",
            )
            netns.run_cmd(
                ["ip", "-n", host.namespace, "link", "set", host.ifname, "gso_max_size", "1500"],
                what="one segment per frame",
            )
        line = subprocess.Popen(
            ["ip", "netns", "exec", cluster.switch, sys.executable, str(DELAY_LINE)]
            + ["--ports", ",".join(h.switch_ifname for h in cluster.hosts)]
            + [f"--{k.replace('_', '-')}={v:g}" for k, v in LOSSY.items()],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert line.stdout is not None
        try:
            assert line.stdout.readline().strip() == "ready"
            yield cluster, "delay_line.py (this kernel has no netem)"
        finally:
            line.terminate()
            stats = line.stdout.read().split()
            line.wait()
        # It did carry the job, with the delay and about the loss asked for.
        carried, dropped, delay = int(stats[1]), int(stats[3]), float(stats[5])
        print(f"delay line: {carried} frames carried, {dropped} dropped, mean delay {delay} ms")
        assert carried > 1000 and abs(delay - LOSSY["delay_ms"]) < 1.0
        assert 0 < dropped < 0.03 * (carried + dropped)


def test_a_lossy_jittery_link_trains_bit_identical_to_a_clean_one(
    uninterrupted: Path, tmp_path: Path
) -> None:
    """Every host's link loses 1% of its packets and delays them by 20 ms +- 10 ms: the run
    takes longer and computes the same bits."""
    with _lossy_cluster() as (lossy, how):
        started = time.monotonic()
        _finished(_run(lossy, tmp_path, "--epochs", str(EPOCHS)), tmp_path)
        print(f"lossy link ({how}): {time.monotonic() - started:.1f} s")
    assert _losses(tmp_path) == _losses(uninterrupted)
    _same_weights(tmp_path, uninterrupted)


@pytest.mark.parametrize(
    ("kind", "named"),
    [
        ("ids", "ID 80 is out of range for table"),
        ("nan", "non-finite"),
    ],
)
def test_a_bad_batch_on_one_rank_raises_a_named_error_on_every_rank(
    small: EmulatedHosts, tmp_path: Path, kind: str, named: str
) -> None:
    """Rank 1's batch of epoch 2 is bad while its previous backward's updates are still on
    the lane: rank 1 raises what is wrong with it, rank 0 that rank 1 rejected its batch,
    and both end on their own (no hang, no abort)."""
    started = time.time()
    results = _run(small, tmp_path, "--epochs", "3", "--bad", kind, "--bad-at", "2")
    last = max(r["ended"] for r in results.values()) - started
    print(f"bad batch ({kind}): every rank ended within {last:.1f} s of the start")
    for rank, result in results.items():
        assert result["code"] == 1, (rank, _logs(tmp_path))
        error = result["record"]["error"]
        assert error["type"] == "ConfigError", (rank, error)
        if rank == 1:
            assert named in error["message"], error["message"]
        else:
            assert "rank(s) [1] rejected their local batch" in error["message"], error["message"]
        assert len(result["record"]["losses"]) == 2  # epochs 0 and 1
