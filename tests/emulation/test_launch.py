"""Real torchrun jobs on the emulated cluster and on the loopback fallback."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from lightning_embark.emulation import EmulatedHosts, EmulationConfig, EmulationFallbackWarning
from lightning_embark.emulation._netns import list_namespaces, netns_unavailable_reason

REASON = netns_unavailable_reason()
needs_netns = pytest.mark.skipif(
    REASON is not None, reason=f"emulated cluster needs root and iproute2: {REASON}"
)


def _records(out: Path) -> list[dict]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(4)]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


@pytest.mark.netns
@pytest.mark.multiprocess
@needs_netns
def test_gloo_job_on_two_hosts(gloo_job, prefix, capsys):
    script, out = gloo_job
    config = EmulationConfig(num_hosts=2, ranks_per_host=2, rate_mbit=800, name_prefix=prefix)
    with EmulatedHosts(config, require_netns=True) as cluster:
        rc = cluster.run([str(script), str(out)])
    assert rc == 0, capsys.readouterr().out[-3000:]
    records = _records(out)
    assert all(r["world"] == 4 and r["sum"] == 6.0 and r["mode"] == "netns" for r in records)
    assert [r["host"] for r in records] == [0, 0, 1, 1]
    assert [r["group_rank"] for r in records] == [0, 0, 1, 1]  # torchrun's node rank agrees
    assert [r["ifname"] for r in records] == ["emb-h0", "emb-h0", "emb-h1", "emb-h1"]
    assert [r["address"] for r in records] == ["10.77.0.1", "10.77.0.1", "10.77.0.2", "10.77.0.2"]
    assert {r["rate"] for r in records} == {"800"}
    # Same network namespace within a host, different ones across hosts.
    assert records[0]["netns"] == records[1]["netns"] != records[2]["netns"] == records[3]["netns"]
    assert records[0]["netns"] != os.readlink("/proc/self/ns/net")
    output = capsys.readouterr().out
    assert "[host 0] rank 0 of 4 done" in output and "[host 1] rank 3 of 4 done" in output


@pytest.mark.netns
@needs_netns
def test_failing_rank_fails_the_job_and_cleans_up(sleep_job, prefix, capsys):
    script, pids = sleep_job
    config = EmulationConfig(num_hosts=2, ranks_per_host=2, name_prefix=prefix)
    start = time.monotonic()
    with EmulatedHosts(config, require_netns=True) as cluster:
        rc = cluster.run([str(script), str(pids), "3"])  # rank 3 (host 1) exits with 3
        assert all(not _alive(int(p.read_text())) for p in pids.iterdir())
    assert rc != 0
    assert time.monotonic() - start < 60  # the sleeping ranks were killed, not waited for
    assert not [ns for ns in list_namespaces() if ns.startswith(cluster.name + "-")]
    assert "[host 1] exited with status" in capsys.readouterr().err


@pytest.mark.multiprocess
def test_loopback_fallback_runs_the_same_job(gloo_job, prefix, capsys):
    script, out = gloo_job
    config = EmulationConfig(num_hosts=2, ranks_per_host=2, name_prefix=prefix)
    cluster = EmulatedHosts(config, force_loopback=True)
    assert cluster.mode == "loopback"
    with pytest.warns(EmulationFallbackWarning, match="NOT emulated"):
        cluster.up()
    try:
        assert cluster.describe().startswith("LOOPBACK FALLBACK (not emulated")
        rc = cluster.run([str(script), str(out)])
    finally:
        cluster.down()
    assert rc == 0, capsys.readouterr().out[-3000:]
    records = _records(out)
    assert all(r["world"] == 4 and r["sum"] == 6.0 for r in records)
    assert {r["mode"] for r in records} == {"loopback"}
    assert {r["ifname"] for r in records} == {"lo"}
    assert {r["num_hosts"] for r in records} == {2}
    assert [r["host"] for r in records] == [0, 0, 1, 1]  # the rank->host map is still known
    assert "[loopback] rank 3 of 4 done" in capsys.readouterr().out
