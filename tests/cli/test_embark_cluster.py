"""The ``embark-cluster`` command: up/down with a state file, run, errors, Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from lightning_embark.cli import embark_cluster as cli
from lightning_embark.emulation._netns import (
    delete_namespace,
    list_namespaces,
    netns_unavailable_reason,
)
from lightning_embark.emulation._state import attach_hosts

REASON = netns_unavailable_reason()
needs_netns = pytest.mark.skipif(
    REASON is not None, reason=f"emulated cluster needs root and iproute2: {REASON}"
)
REPO = Path(__file__).resolve().parents[2]


def test_bad_options_exit_2_with_the_fix(tmp_path, capsys):
    state = ["--state-file", str(tmp_path / "state.json")]
    assert cli.main([*state, "run", "--hosts", "0", "--", "x.py"]) == 2
    assert "num_hosts must be a positive integer, got 0" in capsys.readouterr().err
    assert cli.main([*state, "run", "--force-loopback"]) == 2
    assert "needs a script" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main([*state, "up", "--rate-mbit", "fast"])
    assert "expected Mbit/s" in capsys.readouterr().err


def test_down_without_cluster(tmp_path, prefix, capsys):
    assert (
        cli.main(["--state-file", str(tmp_path / "none.json"), "down", "--name-prefix", prefix])
        == 0
    )
    assert "no cluster was up" in capsys.readouterr().out


@pytest.mark.netns
@needs_netns
def test_up_attach_down(tmp_path, prefix, capsys):
    state_file = tmp_path / "state.json"
    state = ["--state-file", str(state_file)]
    up = [
        *state,
        "up",
        "--hosts",
        "2",
        "--ranks-per-host",
        "1",
        "--rate-mbit",
        "200",
        "--name-prefix",
        prefix,
        "--measure-seconds",
        "0.3",
    ]
    assert cli.main(up) == 0
    try:
        out = capsys.readouterr().out
        assert "emulated: 2 hosts x 1 ranks, inter-host 200 Mbit/s shaped veth" in out
        assert "10.77.0.2" in out and "measured (TCP" in out
        recorded = json.loads(state_file.read_text())
        namespaces = [h["namespace"] for h in recorded["hosts"]] + [recorded["switch"]]
        assert set(namespaces) <= set(list_namespaces())
        assert recorded["measured"]["inter_host_mb_s"] < 40
        assert cli.main(up) == 1  # already up
        assert "already up" in capsys.readouterr().err

        # `run --attach` launches on the recorded namespaces (the launch itself is
        # the same code as a fresh cluster's, exercised in test_launch.py).
        attached = attach_hosts(state_file)
        assert attached.mode == "netns" and not attached.owned
        launches = attached.launches(["train.py"])
        assert [launch.argv[:4] for launch in launches] == [
            ["ip", "netns", "exec", ns] for ns in namespaces[:2]
        ]
        assert launches[1].argv[launches[1].argv.index("--master-addr") + 1] == "10.77.0.1"
        assert launches[1].env["GLOO_SOCKET_IFNAME"] == "emb-h1"
        attached.down()  # not owned: leaves the cluster up
        assert set(namespaces) <= set(list_namespaces())  # attach leaves the cluster up
    finally:
        assert cli.main(["down", "--state-file", str(state_file), "--name-prefix", prefix]) == 0
    assert "removed 3 namespaces" in capsys.readouterr().out
    assert not set(namespaces) & set(list_namespaces())
    assert not state_file.exists()


@pytest.mark.netns
@needs_netns
def test_sigint_during_run_cleans_up(sleep_job, prefix):
    script, pids = sleep_job
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "lightning_embark.cli.embark_cluster",
            "run",
            "--hosts",
            "2",
            "--ranks-per-host",
            "2",
            "--name-prefix",
            prefix,
            "--",
            str(script),
            str(pids),
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        # A signal the test process ignores stays ignored in its children (and Python then
        # installs no KeyboardInterrupt handler): start the command as a shell would.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    lines: list[str] = []
    all_ready = threading.Event()

    def read() -> None:
        for line in proc.stdout:
            lines.append(line)
            if "".join(lines).count("ready") >= 4:  # ranks of a host may share a line
                all_ready.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert all_ready.wait(60), "".join(lines)[-3000:]
        ours = [ns for ns in list_namespaces() if ns.startswith(f"{prefix}{proc.pid}-")]
        assert len(ours) == 3
        start = time.monotonic()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 130
        assert time.monotonic() - start < 20
    finally:
        if proc.poll() is None:  # the test failed: still try a clean stop first
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    reader.join(5)
    assert "interrupted" in "".join(lines)
    assert not [ns for ns in list_namespaces() if ns.startswith(f"{prefix}{proc.pid}-")]
    for pid_file in pids.iterdir():
        assert not os.path.exists(f"/proc/{pid_file.read_text()}/cmdline") or _zombie(
            int(pid_file.read_text())
        )


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def _up_args(state_file: Path, prefix: str) -> list[str]:
    return [
        "--state-file",
        str(state_file),
        "up",
        "--hosts",
        "2",
        "--ranks-per-host",
        "1",
        "--name-prefix",
        prefix,
        "--measure-seconds",
        "0",
    ]


@pytest.mark.netns
@needs_netns
def test_up_clears_what_is_left_of_a_broken_recorded_cluster(tmp_path, prefix, capsys):
    state_file = tmp_path / "state.json"
    assert cli.main(_up_args(state_file, prefix)) == 0
    first = json.loads(state_file.read_text())
    try:
        assert first["name"].startswith(f"{prefix}up")  # kept: launches leave it alone
        host1 = first["hosts"][1]["namespace"]
        delete_namespace(host1)  # the cluster is broken: it cannot run jobs any more
        capsys.readouterr()
        assert cli.main(_up_args(state_file, prefix)) == 0
        out = capsys.readouterr().out
        remains = sorted({first["hosts"][0]["namespace"], first["switch"]})
        assert (
            f"removed what was left of cluster {first['name']} recorded in {state_file} "
            f"(namespaces [{host1!r}] were gone)"
        ) in out
        assert not set(remains) & set(list_namespaces())
        second = json.loads(state_file.read_text())
        assert second["name"] != first["name"] and second["switch"] in list_namespaces()
    finally:
        assert cli.main(["--state-file", str(state_file), "down", "--name-prefix", prefix]) == 0
    assert not [ns for ns in list_namespaces() if ns.startswith(prefix)]


@pytest.mark.netns
@needs_netns
def test_down_keeps_and_names_a_cluster_another_state_file_records(tmp_path, prefix, capsys):
    mine, other = tmp_path / "mine.json", tmp_path / "other.json"
    assert cli.main(_up_args(other, prefix)) == 0
    recorded = json.loads(other.read_text())
    namespaces = [h["namespace"] for h in recorded["hosts"]] + [recorded["switch"]]
    try:
        capsys.readouterr()
        assert cli.main(["--state-file", str(mine), "down", "--name-prefix", prefix]) == 0
        out = capsys.readouterr().out
        assert "no cluster was up" in out
        assert "kept 3 namespaces of clusters another state file records" in out
        assert all(ns in out for ns in namespaces) and "ip netns delete NAME" in out
        assert set(namespaces) <= set(list_namespaces())
    finally:
        assert cli.main(["--state-file", str(other), "down", "--name-prefix", prefix]) == 0
    assert not set(namespaces) & set(list_namespaces())


def test_the_state_file_option_defaults_to_a_per_user_file(monkeypatch, tmp_path):
    monkeypatch.delenv("EMBARK_CLUSTER_STATE", raising=False)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    args = cli.build_parser().parse_args(["down"])
    assert args.state_file == tmp_path / "lightning-embark" / "embark-cluster.json"
    monkeypatch.setenv("EMBARK_CLUSTER_STATE", str(tmp_path / "x.json"))
    assert cli.build_parser().parse_args(["down"]).state_file == tmp_path / "x.json"
