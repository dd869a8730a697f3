"""Network-namespace plumbing for the emulated cluster: ``ip`` and ``tc`` via subprocess.

Each emulated host is a network namespace. Hosts are joined by veth pairs to a
bridge that lives in a namespace of its own (the "switch"), so nothing is added to
the machine's real (root) network namespace and parallel clusters can reuse the same
subnet. Traffic between ranks of one host goes to the host's own address, which
Linux routes over loopback: unshaped, the "fast links". Every veth is shaped with
``tc`` on both ends, so a host's send and its receive are each limited to the rate,
like a full-duplex NIC.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass

from lightning_embark.errors import EmulationError

BRIDGE = "br0"
_CMD_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class HostNet:
    """One emulated host's network identity.

    Attributes:
        namespace: Network namespace name (``ip netns exec <namespace> ...``).
        ifname: Its interface to the switch; GLOO_SOCKET_IFNAME for its ranks.
        switch_ifname: The peer end of the veth, a port of the switch's bridge.
        address: Its IPv4 address on the inter-host subnet.
        prefixlen: Prefix length of that subnet.
    """

    namespace: str
    ifname: str
    switch_ifname: str
    address: str
    prefixlen: int


def run_cmd(argv: Sequence[str], *, what: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run one plumbing command and turn failures into :class:`EmulationError`.

    Args:
        argv: The command.
        what: What the command was for; starts the error message.
        check: Raise on a non-zero exit status.

    Raises:
        EmulationError: The command is missing, timed out or failed (with its stderr).
    """
    try:
        proc = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=_CMD_TIMEOUT_S, check=False
        )
    except FileNotFoundError as exc:
        raise EmulationError(f"{what}: {argv[0]!r} not found ({exc}); install iproute2") from None
    except subprocess.TimeoutExpired:
        raise EmulationError(
            f"{what}: `{' '.join(argv)}` did not finish in {_CMD_TIMEOUT_S:g} s"
        ) from None
    if check and proc.returncode != 0:
        raise EmulationError(
            f"{what}: `{' '.join(argv)}` exited with {proc.returncode}: {proc.stderr.strip()}"
        )
    return proc


def netns_unavailable_reason() -> str | None:
    """Why namespaces cannot be used here, or None when they probably can.

    A cheap check (no namespace is created); :meth:`EmulatedHosts.up` still falls
    back when creation itself fails, e.g. in a container without CAP_SYS_ADMIN.
    """
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "not running as root (network namespaces and tc need root)"
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        return f"{' and '.join(missing)} not found on PATH (install iproute2)"
    return None


def list_namespaces() -> list[str]:
    """Names of all network namespaces known to ``ip netns``."""
    proc = run_cmd(["ip", "netns", "list"], what="listing network namespaces")
    return [line.split()[0] for line in proc.stdout.splitlines() if line.strip()]


def namespace_pids(namespace: str) -> list[int]:
    """PIDs of the processes running inside ``namespace`` (empty if it is gone)."""
    proc = run_cmd(["ip", "netns", "pids", namespace], what="listing pids", check=False)
    return [int(tok) for tok in proc.stdout.split() if tok.isdigit()]


def kill_namespace_processes(namespace: str, *, grace_s: float = 2.0) -> None:
    """SIGTERM every process in ``namespace``, then SIGKILL what survives ``grace_s``.

    A namespace that still holds processes outlives ``ip netns del``, so teardown
    must empty it first; everything in it belongs to the cluster that created it.
    """
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 1.0)):
        pids = namespace_pids(namespace)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and namespace_pids(namespace):
            time.sleep(0.05)


def delete_namespace(namespace: str) -> None:
    """Remove ``namespace`` and the veth ends inside it; a missing one is fine."""
    kill_namespace_processes(namespace)
    proc = run_cmd(["ip", "netns", "delete", namespace], what="deleting namespace", check=False)
    if proc.returncode != 0 and namespace in list_namespaces():
        raise EmulationError(
            f"could not delete network namespace {namespace!r}: {proc.stderr.strip()}; "
            f"remove it with `ip netns delete {namespace}`"
        )


def create_switch(namespace: str) -> None:
    """Create the switch namespace holding the bridge every host connects to."""
    run_cmd(["ip", "netns", "add", namespace], what=f"creating switch namespace {namespace}")
    run_cmd(
        ["ip", "-n", namespace, "link", "set", "lo", "up"], what="bringing up lo in the switch"
    )
    run_cmd(
        ["ip", "-n", namespace, "link", "add", BRIDGE, "type", "bridge"],
        what="creating the bridge",
    )
    run_cmd(["ip", "-n", namespace, "link", "set", BRIDGE, "up"], what="bringing up the bridge")


def create_host(switch: str, host: HostNet) -> None:
    """Create a host namespace and wire it to the switch's bridge with a veth pair."""
    ns = host.namespace
    run_cmd(["ip", "netns", "add", ns], what=f"creating host namespace {ns}")
    run_cmd(["ip", "-n", ns, "link", "set", "lo", "up"], what=f"bringing up lo in {ns}")
    run_cmd(
        [
            "ip",
            "-n",
            switch,
            "link",
            "add",
            host.switch_ifname,
            "type",
            "veth",
            "peer",
            "name",
            host.ifname,
            "netns",
            ns,
        ],
        what=f"creating the veth pair of {ns}",
    )
    run_cmd(
        ["ip", "-n", switch, "link", "set", host.switch_ifname, "master", BRIDGE, "up"],
        what=f"attaching {host.switch_ifname} to the bridge",
    )
    run_cmd(
        ["ip", "-n", ns, "addr", "add", f"{host.address}/{host.prefixlen}", "dev", host.ifname],
        what=f"assigning {host.address} in {ns}",
    )
    run_cmd(["ip", "-n", ns, "link", "set", host.ifname, "up"], what=f"bringing up {host.ifname}")


def shape(
    namespace: str,
    dev: str,
    *,
    rate_mbit: float | None,
    delay_ms: float = 0.0,
    jitter_ms: float = 0.0,
    loss_percent: float = 0.0,
) -> None:
    """Limit ``dev``'s egress to ``rate_mbit``, delay it by ``delay_ms +- jitter_ms`` and
    drop ``loss_percent`` of its packets.

    tbf does the rate (it splits GSO super-packets, so veth offloads are harmless);
    netem, as tbf's parent, does the delay and the loss. The tbf queue holds ~50 ms of
    traffic plus the bandwidth-delay product, so TCP sees few drops and reaches the rate.
    """
    tc = ["tc", "-n", namespace, "qdisc"]
    what = f"shaping {dev} in {namespace}"
    tbf_parent = ["root"]
    if delay_ms > 0 or loss_percent > 0:
        impair = ["delay", f"{delay_ms:g}ms"] + ([f"{jitter_ms:g}ms"] if jitter_ms > 0 else [])
        if loss_percent > 0:
            impair += ["loss", f"{loss_percent:g}%"]
        proc = run_cmd(
            [
                *tc,
                "replace",
                "dev",
                dev,
                "root",
                "handle",
                "1:",
                "netem",
                *impair,
                "limit",
                "100000",
            ],
            what=what,
            check=False,
        )
        if proc.returncode != 0:
            hint = ""
            if "unknown" in proc.stderr:
                hint = (
                    " (this kernel has no netem qdisc, CONFIG_NET_SCH_NETEM; try `modprobe "
                    "sch_netem` or use delay_ms=0 and loss_percent=0)"
                )
            raise EmulationError(
                f"{what}: cannot add netem {' '.join(impair)}: {proc.stderr.strip()}{hint}"
            )
        tbf_parent = ["parent", "1:1", "handle", "10:"]
    if rate_mbit is None:
        return
    rate_bytes = rate_mbit * 1e6 / 8
    burst = max(int(rate_bytes * 0.002), 64 * 1024)
    limit = max(int(rate_bytes * (0.05 + 2 * delay_ms / 1000)), 4 * burst)
    verb = "add" if delay_ms > 0 or loss_percent > 0 else "replace"
    run_cmd(
        [
            *tc,
            verb,
            "dev",
            dev,
            *tbf_parent,
            "tbf",
            "rate",
            f"{rate_mbit:g}mbit",
            "burst",
            str(burst),
            "limit",
            str(limit),
        ],
        what=what,
    )


def unshape(namespace: str, dev: str) -> None:
    """Remove ``dev``'s shaping (its root qdisc); a device without one is left as it is."""
    proc = run_cmd(
        ["tc", "-n", namespace, "qdisc", "del", "dev", dev, "root"],
        what=f"unshaping {dev} in {namespace}",
        check=False,
    )
    if (
        proc.returncode != 0
        and "No such file" not in proc.stderr
        and "Cannot find" not in (proc.stderr)
        and "Invalid handle" not in proc.stderr
    ):
        raise EmulationError(f"unshaping {dev} in {namespace}: {proc.stderr.strip()}")


#: Clusters that ``embark-cluster up`` leaves running on purpose are named
#: ``<prefix>up<pid>-...``: their creator exits by design, so its pid says nothing about
#: whether they are in use, and :func:`cleanup_stale` never takes them.
KEPT_TAG = "up"


def kept_namespaces(prefix: str) -> list[str]:
    """Namespaces of clusters ``embark-cluster up`` left running (any state file's);
    empty where namespaces cannot be used."""
    if netns_unavailable_reason() is not None:
        return []
    pattern = re.compile(re.escape(prefix + KEPT_TAG) + r"\d+-")
    return [ns for ns in list_namespaces() if pattern.match(ns)]


def owner_pid(namespace: str, prefix: str) -> int | None:
    """The PID encoded in a cluster namespace name ``<prefix><pid>-...``, if any
    (None for the kept clusters of ``embark-cluster up``, ``<prefix>up<pid>-...``)."""
    if not namespace.startswith(prefix):
        return None
    match = re.match(r"(\d+)-", namespace[len(prefix) :])
    return int(match.group(1)) if match else None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def cleanup_stale(prefix: str = "embark-", *, include_live: bool = False) -> list[str]:
    """Remove leftover cluster namespaces whose creating process has exited.

    Clusters are named ``<prefix><pid>-<n>-...``; a namespace whose pid is still
    alive belongs to a running cluster (possibly another user's job) and is kept
    unless ``include_live``; one whose pid is gone was left by a launcher killed
    before it could clean up (SIGKILL, OOM). The clusters ``embark-cluster up``
    leaves running are named ``<prefix>up<pid>-...`` and are never taken here:
    ``embark-cluster down`` removes them through their state file.

    Returns:
        The namespaces removed.
    """
    if netns_unavailable_reason() is not None:
        return []
    removed = []
    for ns in list_namespaces():
        pid = owner_pid(ns, prefix)
        if pid is None:
            continue
        if not include_live and (pid == os.getpid() or _pid_alive(pid)):
            continue
        delete_namespace(ns)
        removed.append(ns)
    return removed
