"""Creating and removing the emulated cluster, fallback rules, and the link shaping."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings

import pytest

from lightning_embark.emulation import (
    EmulatedHosts,
    EmulationConfig,
    EmulationFallbackWarning,
    measure_link,
)
from lightning_embark.emulation import _hosts as hosts
from lightning_embark.emulation import _netns as netns
from lightning_embark.errors import ConfigError, EmulationError

REASON = netns.netns_unavailable_reason()
needs_netns = pytest.mark.skipif(
    REASON is not None, reason=f"emulated cluster needs root and iproute2: {REASON}"
)
TEST_PREFIX = "embtest-"  # same as conftest.TEST_PREFIX, which the leftover guard watches


def _config(**kwargs) -> EmulationConfig:
    return EmulationConfig(
        **({"num_hosts": 2, "ranks_per_host": 1, "name_prefix": TEST_PREFIX} | kwargs)
    )


def _namespaces() -> set[str]:
    out = subprocess.run(
        ["ip", "netns", "list"], capture_output=True, text=True, check=True
    ).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


# ---------------------------------------------------------------- no root needed
def test_fallback_when_namespaces_unavailable(monkeypatch):
    monkeypatch.setattr(netns, "netns_unavailable_reason", lambda: "not running as root (test)")
    cluster = EmulatedHosts(_config())
    assert cluster.mode == "loopback"
    with pytest.warns(EmulationFallbackWarning, match="NOT emulated"):
        cluster.up()
    try:
        assert cluster.describe().startswith("LOOPBACK FALLBACK (not emulated")
        assert "not running as root (test)" in cluster.describe()
        env = cluster.job_env(0)
        assert env["EMBARK_CLUSTER_MODE"] == "loopback"
        assert env["GLOO_SOCKET_IFNAME"] == "lo"
        assert env["EMBARK_INTER_HOST_RATE_MBIT"] == "0"
        (launch,) = cluster.launches(["train.py"])
        assert "--nproc-per-node" in launch.argv
        assert launch.argv[launch.argv.index("--nproc-per-node") + 1] == "2"
        assert launch.argv[launch.argv.index("--master-addr") + 1] == "127.0.0.1"
    finally:
        cluster.down()


def test_unavailable_reasons(monkeypatch):
    monkeypatch.setattr(netns.os, "geteuid", lambda: 1000)
    assert "not running as root" in netns.netns_unavailable_reason()
    monkeypatch.setattr(netns.os, "geteuid", lambda: 0)
    monkeypatch.setattr(
        netns.shutil, "which", lambda tool: None if tool == "tc" else "/usr/sbin/ip"
    )
    assert netns.netns_unavailable_reason() == "tc not found on PATH (install iproute2)"


def test_require_netns_refuses_fallback(monkeypatch):
    monkeypatch.setattr(netns, "netns_unavailable_reason", lambda: "ip and tc not found on PATH")
    with pytest.raises(EmulationError, match="required but ip and tc not found"):
        EmulatedHosts(_config(), require_netns=True)


def test_force_loopback_by_environment(monkeypatch):
    monkeypatch.setenv(hosts.FORCE_LOOPBACK_ENV, "1")
    cluster = EmulatedHosts(_config())
    assert cluster.mode == "loopback"
    assert hosts.FORCE_LOOPBACK_ENV not in cluster.job_env(0)


def test_run_needs_up_and_a_script():
    cluster = EmulatedHosts(_config(), force_loopback=True)
    with pytest.raises(EmulationError, match="not up"):
        cluster.run(["x.py"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", EmulationFallbackWarning)
        with cluster, pytest.raises(ConfigError, match="needs a script"):
            cluster.run([])
    with pytest.raises(ConfigError, match="needs a EmulationConfig"):
        EmulatedHosts({"num_hosts": 2})  # type: ignore[arg-type]


# ------------------------------------------------------------------- root needed
@pytest.mark.netns
@needs_netns
def test_up_down_creates_and_removes_namespaces():
    cluster = EmulatedHosts(_config(num_hosts=3), require_netns=True)
    expected = {f"{cluster.name}-h{h}" for h in range(3)} | {f"{cluster.name}-sw"}
    assert not expected & _namespaces()
    with cluster:
        assert cluster.mode == "netns"
        assert expected <= _namespaces()
        assert cluster.describe() == (
            "emulated: 3 hosts x 1 ranks, inter-host 800 Mbit/s shaped veth, intra-host loopback"
        )
        host = cluster.hosts[2]
        addr = subprocess.run(
            ["ip", "-n", host.namespace, "-j", "addr", "show", "dev", host.ifname],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert json.loads(addr)[0]["addr_info"][0]["local"] == "10.77.0.3"
        lo = subprocess.run(
            ["ip", "-n", host.namespace, "-j", "link", "show", "lo"],
            capture_output=True,
            text=True,
        ).stdout
        assert "UP" in json.loads(lo)[0]["flags"]
        qdisc = subprocess.run(
            ["tc", "-n", host.namespace, "qdisc", "show", "dev", host.ifname],
            capture_output=True,
            text=True,
        ).stdout
        assert "tbf" in qdisc and "800Mbit" in qdisc
    assert not expected & _namespaces()
    cluster.down()  # idempotent


@pytest.mark.netns
@needs_netns
def test_cleanup_on_exception_inside_context():
    cluster = EmulatedHosts(_config(), require_netns=True)
    # The error is raised inside the context on purpose: the context must clean up.
    with pytest.raises(RuntimeError, match="boom"), cluster:  # noqa: PT012
        assert cluster.switch in _namespaces()
        raise RuntimeError("boom")
    assert not {ns for ns in _namespaces() if ns.startswith(cluster.name + "-")}


@pytest.mark.netns
@needs_netns
def test_creation_failure_falls_back_and_cleans_up(monkeypatch):
    real = netns.create_host

    def fail_second(switch, host):
        if host.namespace.endswith("-h1"):
            raise EmulationError(
                "creating host namespace: `ip netns add` exited with 1: Operation not permitted"
            )
        real(switch, host)

    monkeypatch.setattr(netns, "create_host", fail_second)
    cluster = EmulatedHosts(_config())
    with pytest.warns(EmulationFallbackWarning, match="Operation not permitted"):
        cluster.up()
    try:
        assert cluster.mode == "loopback"
        assert not {ns for ns in _namespaces() if ns.startswith(cluster.name + "-")}
    finally:
        cluster.down()


@pytest.mark.netns
@needs_netns
def test_delay_jitter_and_loss_are_applied_or_refused_cleanly():
    # Some kernels (like a Firecracker VM's) lack netem: then up() must say so and leave nothing.
    config = _config(delay_ms=2.0, jitter_ms=1.0, loss_percent=0.5)
    cluster = EmulatedHosts(config, require_netns=True)
    try:
        cluster.up()
    except EmulationError as exc:
        # Either outcome is right; a refusal must say why.
        assert "netem delay 2ms 1ms loss 0.5%" in str(exc)  # noqa: PT017
    else:
        qdisc = subprocess.run(
            [
                "tc",
                "-n",
                cluster.hosts[0].namespace,
                "qdisc",
                "show",
                "dev",
                cluster.hosts[0].ifname,
            ],
            capture_output=True,
            text=True,
        ).stdout
        assert "netem" in qdisc and "tbf" in qdisc and "loss 0.5%" in qdisc
        assert "+2 ms one-way +- 1 ms, 0.5% packet loss" in cluster.describe()
    finally:
        cluster.down()
    assert not {ns for ns in _namespaces() if ns.startswith(cluster.name + "-")}


@pytest.mark.netns
@needs_netns
def test_shaped_link_is_much_slower_than_intra_host():
    with EmulatedHosts(_config(rate_mbit=200), require_netns=True) as cluster:
        link = measure_link(cluster, seconds=0.5)
    # 200 Mbit/s = 25 MB/s nominal; loopback inside a host reaches GB/s.
    assert 5 < link.inter_host_mb_s < 40, link.summary()
    assert link.intra_host_mb_s > 3 * link.inter_host_mb_s, link.summary()
    assert link.mode == "netns" and "ratio" in link.summary()


@pytest.mark.netns
@needs_netns
def test_shaping_comes_off_and_back_on_the_same_hosts():
    """An exposed-communication pair runs one job on the shaped link and one on the same
    hosts unshaped: the qdiscs go and come back, the description and the rate the ranks
    are told follow, and the link measures several times faster unshaped (a 100 Mbit/s
    shaped veth against the veth's own rate, GB/s on loopback-backed veths here: a factor 3
    is far inside that)."""

    def qdiscs(cluster: EmulatedHosts) -> str:
        return "".join(
            subprocess.run(
                ["tc", "-n", ns, "qdisc", "show", "dev", dev],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            for host in cluster.hosts
            for ns, dev in ((host.namespace, host.ifname), (cluster.switch, host.switch_ifname))
        )

    with EmulatedHosts(_config(rate_mbit=100), require_netns=True) as cluster:
        assert qdiscs(cluster).count("tbf") == 4
        shaped = measure_link(cluster, seconds=0.3).inter_host_mb_s
        cluster.set_shaped(False)
        assert "tbf" not in qdiscs(cluster)
        assert "unshaped veth" in cluster.describe()
        assert cluster.job_env(0)["EMBARK_INTER_HOST_RATE_MBIT"] == "0"
        unshaped = measure_link(cluster, seconds=0.3).inter_host_mb_s
        cluster.set_shaped(False)  # idempotent
        cluster.set_shaped(True)
        assert qdiscs(cluster).count("tbf") == 4
        assert cluster.job_env(0)["EMBARK_INTER_HOST_RATE_MBIT"] == "100"
    assert unshaped > 3 * shaped, (shaped, unshaped)


@pytest.mark.netns
@needs_netns
def test_cleanup_stale_removes_dead_owners_only():
    dead = f"{TEST_PREFIX}999999999-0-h0"  # no such pid
    live = f"{TEST_PREFIX}1-0-h0"  # pid 1 is alive
    for ns in (dead, live):
        subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        removed = netns.cleanup_stale(TEST_PREFIX)
        assert dead in removed and live not in removed
        assert dead not in _namespaces() and live in _namespaces()
    finally:
        for ns in (dead, live):
            netns.delete_namespace(ns)


# ------------------------------------------------- leftovers of killed launchers
# Creates a cluster, then either leaves it running on purpose as `embark-cluster up`
# does ("kept") or dies by SIGKILL, so that nothing cleans up ("killed").
_KILLED_LAUNCHER = """
import atexit, os, signal, sys
from lightning_embark.emulation import EmulatedHosts, EmulationConfig
config = EmulationConfig(num_hosts=2, ranks_per_host=1, name_prefix=sys.argv[1])
cluster = EmulatedHosts(config, require_netns=True, kept=sys.argv[2] == "kept").up()
print(cluster.name, flush=True)
if sys.argv[2] == "kept":
    atexit.unregister(cluster.down)
else:
    os.kill(os.getpid(), signal.SIGKILL)
"""


def _launch_and_die(kind: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", _KILLED_LAUNCHER, TEST_PREFIX, kind],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.stdout.strip(), proc.stderr
    return proc.stdout.split()[0]


@pytest.mark.netns
@needs_netns
def test_a_launch_removes_what_a_killed_launcher_left_but_not_a_kept_cluster(caplog):
    kept = _launch_and_die("kept")  # first: every launch removes killed launchers' namespaces
    killed = _launch_and_die("killed")
    try:
        leftovers = {ns for ns in _namespaces() if ns.startswith(f"{killed}-")}
        kept_namespaces = {ns for ns in _namespaces() if ns.startswith(f"{kept}-")}
        assert len(leftovers) == 3 and len(kept_namespaces) == 3  # 2 hosts and the switch
        assert kept.startswith(f"{TEST_PREFIX}up")
        assert set(netns.kept_namespaces(TEST_PREFIX)) >= kept_namespaces
        with (
            caplog.at_level("WARNING", logger="lightning_embark.emulation._hosts"),
            EmulatedHosts(_config(), require_netns=True),
        ):
            pass
        assert not leftovers & _namespaces()
        assert kept_namespaces <= _namespaces()  # `embark-cluster up`'s cluster stays
        (record,) = [r for r in caplog.records if "no longer runs" in r.getMessage()]
        assert "removed 3 network namespaces of embark clusters" in record.getMessage()
        assert all(ns in record.getMessage() for ns in leftovers)
    finally:
        for ns in sorted(ns for ns in _namespaces() if ns.startswith((f"{killed}-", f"{kept}-"))):
            netns.delete_namespace(ns)
