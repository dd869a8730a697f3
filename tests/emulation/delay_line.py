"""A lossy, jittery wire between the emulated hosts, for kernels without ``tc netem``.

Run inside the cluster's switch namespace by ``test_faults.py`` when ``tc`` has no netem
qdisc (a Firecracker VM's kernel has none). The hosts' switch-side veth ends leave the
bridge, and this process carries their frames instead (AF_PACKET sockets): each frame one
end receives goes out of the end its destination MAC was last seen on (all others while
unknown) after ``delay +- jitter`` ms, drawn uniformly as netem's jitter is, or is dropped
with probability ``loss``. TCP's checksums are filled in here (the veth leaves them to
offload) and the hosts' links send no segment over one MTU (``gso_max_size``), so every
frame is a packet the peer's stack accepts. The links' ``tbf`` rate stays in force.

Slow (Python per packet): for the fault tests' few megabytes, not for benchmarks.
Writes ``ready`` to stdout once its sockets are open and, when stopped (SIGTERM), how many
frames it carried and dropped and their mean delay.
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import random
import select
import signal
import socket
import struct
import sys
import time

ETH_P_ALL = 0x0003
PACKET_OUTGOING = 4
_IPV4, _TCP, _UDP = 0x0800, 6, 17


def _ones_complement_sum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return total


def with_checksum(frame: bytes) -> bytes:
    """``frame`` with its IPv4 TCP or UDP checksum computed (other frames unchanged)."""
    if len(frame) < 34 or struct.unpack("!H", frame[12:14])[0] != _IPV4:
        return frame
    ihl = (frame[14] & 0x0F) * 4
    protocol = frame[23]
    total_length = struct.unpack("!H", frame[16:18])[0]
    start, end = 14 + ihl, 14 + total_length
    offset = {_TCP: 16, _UDP: 6}.get(protocol)
    if offset is None or end > len(frame) or end - start < offset + 2:
        return frame
    segment = bytearray(frame[start:end])
    segment[offset : offset + 2] = b"\0\0"
    pseudo = frame[26:34] + struct.pack("!BBH", 0, protocol, len(segment))
    checksum = 0xFFFF - _ones_complement_sum(pseudo + bytes(segment))
    if protocol == _UDP and checksum == 0:
        checksum = 0xFFFF
    segment[offset : offset + 2] = struct.pack("!H", checksum)
    return frame[:start] + bytes(segment) + frame[end:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ports", required=True, help="switch-side interfaces, comma-separated")
    parser.add_argument("--delay-ms", type=float, required=True)
    parser.add_argument("--jitter-ms", type=float, default=0.0)
    parser.add_argument("--loss-percent", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    ports = []
    for name in args.ports.split(","):
        sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        sock.bind((name, 0))
        sock.setblocking(False)
        ports.append(sock)
    by_fd = {sock.fileno(): i for i, sock in enumerate(ports)}
    where: dict[bytes, int] = {}  # MAC -> the port it was last seen on
    due: list[tuple[float, int, int, bytes]] = []  # (time, order, port, frame)
    order = 0
    carried = dropped = 0
    delays = 0.0

    def stop(*_: object) -> None:
        mean = delays / carried if carried else 0.0
        print(f"carried {carried} dropped {dropped} mean_delay_ms {mean:.2f}", flush=True)
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    print("ready", flush=True)
    while True:
        wait = max(0.0, due[0][0] - time.monotonic()) if due else 1.0
        readable, _, _ = select.select(list(by_fd), [], [], wait)
        for fd in readable:
            came = by_fd[fd]
            while True:
                try:
                    frame, address = ports[came].recvfrom(65535)
                except BlockingIOError:
                    break
                if address[2] == PACKET_OUTGOING or len(frame) < 14:
                    continue  # what this process sent out of the port
                where[frame[6:12]] = came
                if rng.random() * 100 < args.loss_percent:
                    dropped += 1
                    continue
                delay = rng.uniform(args.delay_ms - args.jitter_ms, args.delay_ms + args.jitter_ms)
                carried += 1
                delays += delay
                target = where.get(frame[0:6])
                outs = [target] if target is not None else range(len(ports))
                frame = with_checksum(frame)
                for out in outs:
                    if out != came:
                        order += 1
                        heapq.heappush(due, (time.monotonic() + delay / 1000, order, out, frame))
        now = time.monotonic()
        while due and due[0][0] <= now:
            _, _, out, frame = heapq.heappop(due)
            with contextlib.suppress(OSError):  # a full queue loses the frame, as a wire would
                ports[out].send(frame)


if __name__ == "__main__":
    main()
