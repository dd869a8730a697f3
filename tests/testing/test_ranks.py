"""``run_gloo_ranks``: ranks fork from a single-threaded fork server, never from the test
process, and get what they need from the caller explicitly."""

from __future__ import annotations

import multiprocessing.forkserver
import os
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from lightning_embark.testing import rank_context, run_gloo_ranks


def _report(rank: int, world: int, queue: Any, helper: ModuleType, parent: int) -> None:
    queue.put(
        {
            "rank": rank,
            "forked_from_caller": os.getppid() == parent,
            "env": os.environ.get("EMBARK_TEST_RANKS_MARK"),
            "cwd": os.getcwd(),
            "helper": helper.tiny_spec(num_tables=1).tables[0].name,
        }
    )


@pytest.mark.multiprocess
def test_ranks_fork_from_a_single_threaded_server_with_the_callers_state(
    synthetic: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The test process has threads (pytest's, torch's); the server the ranks fork from has
    one. The caller's environment and working directory as they are now reach the ranks,
    and so does a helper module loaded by path."""
    monkeypatch.setenv("EMBARK_TEST_RANKS_MARK", "now")
    monkeypatch.chdir(tmp_path)
    queue = rank_context().Queue()
    run_gloo_ranks(_report, 2, queue, synthetic, os.getpid())
    reports = sorted((queue.get() for _ in range(2)), key=lambda r: r["rank"])
    for report in reports:
        assert not report["forked_from_caller"]
        assert report["env"] == "now" and report["cwd"] == str(tmp_path)
        assert report["helper"] == "f0"
    server = multiprocessing.forkserver._forkserver._forkserver_pid  # type: ignore[attr-defined]
    assert server is not None and len(os.listdir(f"/proc/{server}/task")) == 1


def _say(rank: int, world: int) -> None:
    print(f"rank {rank} says hello", flush=True)


def _nothing(rank: int, world: int) -> None:
    pass


@pytest.mark.multiprocess
def test_ranks_write_to_the_callers_output_as_it_is_now(capfd: pytest.CaptureFixture) -> None:
    """The fork server keeps the output of whatever started it (here: the terminal, capture
    off); ranks started later write to their caller's current output, which pytest captures."""
    with capfd.disabled():
        run_gloo_ranks(_nothing, 1)  # the server is up, its stdout not this capture's
    run_gloo_ranks(_say, 2)
    out = capfd.readouterr().out
    assert "rank 0 says hello" in out and "rank 1 says hello" in out
