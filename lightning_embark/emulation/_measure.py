"""Measure the links of an emulated cluster with a plain TCP transfer.

The shaping is only worth something if it is checked: ``tc`` accepts rates the
kernel cannot deliver, and TCP over a shaped link reaches less than the nominal
rate. A short transfer with Python sockets, run inside the namespaces, gives the
achieved throughput within a host (loopback) and between two hosts (shaped veth).
"""

from __future__ import annotations

import json
import select
import subprocess
from dataclasses import dataclass

from lightning_embark.emulation._hosts import EmulatedHosts
from lightning_embark.errors import ConfigError, EmulationError

_TIMEOUT_S = 60.0

_SERVER = r"""
import socket, sys
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind((sys.argv[1], 0))
srv.listen(1)
srv.settimeout(float(sys.argv[2]))
print(srv.getsockname()[1], flush=True)
conn, _ = srv.accept()
conn.settimeout(float(sys.argv[2]))
buf, total = bytearray(1 << 20), 0
while True:
    n = conn.recv_into(buf)
    if not n:
        break
    total += n
conn.sendall(str(total).encode())
conn.close()
"""

_CLIENT = r"""
import json, socket, sys, time
addr, port, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
chunk = memoryview(bytes(256 << 10))
sock = socket.create_connection((addr, port), timeout=float(sys.argv[4]))
start = time.perf_counter()
while time.perf_counter() - start < seconds:
    sock.sendall(chunk)
sock.shutdown(socket.SHUT_WR)
ack = b""
while True:
    part = sock.recv(64)
    if not part:
        break
    ack += part
print(json.dumps({"bytes": int(ack), "seconds": time.perf_counter() - start}))
"""


@dataclass(frozen=True)
class LinkMeasurement:
    """Achieved TCP throughput, in MB/s (1e6 bytes per second).

    Attributes:
        intra_host_mb_s: Between two processes of one host (over loopback).
        inter_host_mb_s: From one host to another (over the shaped link); None for
            a single-host cluster.
        mode: The cluster's mode; in ``"loopback"`` both figures are loopback.
        seconds: Duration of each transfer.
    """

    intra_host_mb_s: float
    inter_host_mb_s: float | None
    mode: str
    seconds: float

    @property
    def ratio(self) -> float | None:
        """Intra-host over inter-host throughput (the emulated NVLink:NIC ratio)."""
        if not self.inter_host_mb_s:
            return None
        return self.intra_host_mb_s / self.inter_host_mb_s

    def summary(self) -> str:
        """One human-readable line."""
        text = f"intra-host {self.intra_host_mb_s:.1f} MB/s"
        if self.inter_host_mb_s is not None:
            text += f", inter-host {self.inter_host_mb_s:.1f} MB/s (ratio {self.ratio:.1f}:1)"
        if self.mode == "loopback":
            text += " [loopback fallback: both are loopback]"
        return text


def _prefix(cluster: EmulatedHosts, host: int) -> list[str]:
    if cluster.mode == "netns":
        return ["ip", "netns", "exec", cluster.hosts[host].namespace]
    return []


def _address(cluster: EmulatedHosts, host: int) -> str:
    return cluster.hosts[host].address if cluster.mode == "netns" else "127.0.0.1"


def measure_pair(
    cluster: EmulatedHosts, src_host: int, dst_host: int, *, seconds: float = 1.0
) -> float:
    """Throughput in MB/s of one TCP stream from ``src_host`` to ``dst_host``.

    With ``src_host == dst_host`` the stream stays inside the host (loopback).

    Raises:
        EmulationError: The cluster is not up or a transfer process failed.
    """
    if not cluster.is_up:
        raise EmulationError(
            "measure the links of a cluster that is up (inside `with EmulatedHosts(...)`)"
        )
    for host in (src_host, dst_host):
        if not 0 <= host < cluster.config.num_hosts:
            raise ConfigError(
                f"host {host} is outside a cluster of {cluster.config.num_hosts} hosts"
            )
    addr = _address(cluster, dst_host)
    timeout = f"{_TIMEOUT_S:g}"
    server = subprocess.Popen(
        [*_prefix(cluster, dst_host), cluster.python, "-c", _SERVER, addr, timeout],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert server.stdout is not None  # stdout=PIPE
    try:
        ready, _, _ = select.select([server.stdout], [], [], 15.0)
        line = server.stdout.readline() if ready else ""
        if not line.strip().isdigit():
            server.kill()
            _, err = server.communicate()
            raise EmulationError(
                f"link probe server on host {dst_host} did not start: {err.strip() or 'timeout'}"
            )
        client = subprocess.run(
            [
                *_prefix(cluster, src_host),
                cluster.python,
                "-c",
                _CLIENT,
                addr,
                line.strip(),
                f"{seconds:g}",
                timeout,
            ],
            capture_output=True,
            text=True,
            timeout=seconds + _TIMEOUT_S,
            check=False,
        )
        if client.returncode != 0:
            raise EmulationError(
                f"link probe from host {src_host} to host {dst_host} ({addr}) failed: "
                f"{client.stderr.strip()}"
            )
        result = json.loads(client.stdout)
        return result["bytes"] / result["seconds"] / 1e6
    except subprocess.TimeoutExpired:
        raise EmulationError(
            f"link probe from host {src_host} to host {dst_host} timed out"
        ) from None
    finally:
        if server.poll() is None:
            server.kill()
        server.communicate()


def measure_link(
    cluster: EmulatedHosts, *, seconds: float = 1.0, src_host: int = 0, dst_host: int = 1
) -> LinkMeasurement:
    """Measure intra-host (on ``src_host``) and inter-host (``src_host`` -> ``dst_host``)
    throughput.

    Args:
        cluster: A cluster that is up.
        seconds: Duration of each transfer; longer is more precise.
        src_host: Sending host.
        dst_host: Receiving host; ignored for a single-host cluster.
    """
    if not seconds > 0:
        raise ConfigError(f"measure_link seconds must be > 0, got {seconds!r}")
    intra = measure_pair(cluster, src_host, src_host, seconds=seconds)
    inter = None
    if cluster.config.num_hosts > 1:
        if dst_host == src_host:
            raise ConfigError(
                f"dst_host must differ from src_host={src_host} to measure an inter-host link"
            )
        inter = measure_pair(cluster, src_host, dst_host, seconds=seconds)
    return LinkMeasurement(
        intra_host_mb_s=intra, inter_host_mb_s=inter, mode=cluster.mode, seconds=seconds
    )
