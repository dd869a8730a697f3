"""Launch helpers for the multi-rank baseline tests (CPU processes on gloo)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_embark.testing._ranks import free_port

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent

#: Launcher variables that must not leak from the test process into a fresh job.
_LAUNCH_VARS = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "WORLD_SIZE",
    "RANK",
    "LOCAL_RANK",
    "NODE_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "EMBARK_RANKS_PER_HOST",
    "TORCHELASTIC_RUN_ID",
)


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without launcher variables, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCH_VARS}
    env["PYTHONWARNINGS"] = "ignore"
    env.update(extra)
    return env


def _start(cmd: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    # Output goes to a file: a pipe nobody reads would fill up and stall the job.
    with log.open("w") as sink:
        return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=sink, stderr=subprocess.STDOUT)


def _wait(procs: list[subprocess.Popen], logs: list[Path], timeout: float, what: str) -> None:
    try:
        for proc in procs:
            proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        for proc in procs:
            proc.kill()
            proc.wait()
        tails = "\n".join(log.read_text()[-3000:] for log in logs)
        pytest.fail(f"{what} timed out after {timeout}s\n{tails}")
    if any(p.returncode != 0 for p in procs):
        tails = "\n".join(log.read_text()[-6000:] for log in logs)
        pytest.fail(f"{what} failed (exit codes {[p.returncode for p in procs]})\n{tails}")


def read_ranks(out: Path, world: int) -> list[dict]:
    """The ``rank<k>.json`` files a job wrote, in rank order."""
    files = sorted(out.glob("rank*.json"))
    assert len(files) == world, (
        f"expected {world} rank files in {out}, found {[f.name for f in files]}"
    )
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


def torchrun(
    script: str, args: list[str], *, nodes: int, per_node: int, out: Path, timeout: float = 240
) -> list[dict]:
    """Run ``tests/baseline/<script>`` under torchrun, one agent per emulated node."""
    port = free_port()
    out.mkdir(parents=True, exist_ok=True)
    logs = [out / f"node{node}.log" for node in range(nodes)]
    procs = [
        _start(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes",
                str(nodes),
                "--node_rank",
                str(node),
                "--nproc_per_node",
                str(per_node),
                "--master_addr",
                "127.0.0.1",
                "--master_port",
                str(port),
                str(HERE / script),
                *args,
                "--out",
                str(out),
            ],
            clean_env(),
            logs[node],
        )
        for node in range(nodes)
    ]
    _wait(procs, logs, timeout, f"torchrun {script} {args}")
    return read_ranks(out, nodes * per_node)


def lightning_launch(
    script: str, args: list[str], *, world: int, out: Path, timeout: float = 240
) -> list[dict]:
    """Run ``tests/baseline/<script>``; Lightning's launcher starts the other ranks."""
    out.mkdir(parents=True, exist_ok=True)
    log = out / "launcher.log"
    env = clean_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    proc = _start([sys.executable, str(HERE / script), *args, "--out", str(out)], env, log)
    _wait([proc], [log], timeout, f"{script} {args}")
    return read_ranks(out, world)


@pytest.fixture(scope="session")
def run_torchrun():
    """:func:`torchrun`, for tests (conftest modules are not importable under importlib)."""
    return torchrun


@pytest.fixture(scope="session")
def run_lightning():
    """:func:`lightning_launch`, for tests."""
    return lightning_launch
