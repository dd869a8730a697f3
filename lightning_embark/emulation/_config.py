"""Configuration of the emulated multi-host cluster.

Kept apart from the plumbing so that planners, benchmarks and the CLI can build and
validate a cluster description without touching the network.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from lightning_embark._dictconfig import DictConfig
from lightning_embark.errors import ConfigError

# Inter-host link rate when none is given (docs/architecture.md#the-emulated-cluster): gloo
# over loopback runs at ~0.7-1.1 GB/s and an 800 Mbit shaped veth at ~55 MB/s, i.e. roughly the
# 16:1 intra:inter ratio of NVLink vs a 400 Gb/s NIC. Tune after a baseline measurement.
DEFAULT_RATE_MBIT: float = 800.0

DEFAULT_SUBNET = "10.77.0.0/24"
DEFAULT_NAME_PREFIX = "embark-"

# Namespace names become files under /run/netns and parts of log lines: keep them tame.
_PREFIX_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_.]{0,15}-$")


@dataclass(frozen=True, kw_only=True)
class EmulationConfig(DictConfig):
    """Shape and link characteristics of an emulated cluster.

    Attributes:
        num_hosts: Number of emulated hosts (network namespaces).
        ranks_per_host: torchrun processes per host (``--nproc-per-node``).
        rate_mbit: Rate of every host's link, in Mbit/s per direction (a host's
            egress and its ingress are each shaped), or None for an unshaped veth
            (useful as a baseline measurement).
        delay_ms: One-way latency added between two hosts, in milliseconds.
        jitter_ms: Random variation of that delay, in milliseconds (netem's jitter: each
            packet's delay is ``delay_ms +- jitter_ms``); needs ``delay_ms >= jitter_ms``.
        loss_percent: Packets each host's link drops at random, in percent (netem's
            loss; TCP sends them again, so training sees only the time it costs).
        subnet: IPv4 subnet of the inter-host network; host ``h`` gets the
            ``h + 1``-th address. It lives only inside the cluster's namespaces, so
            parallel clusters may reuse it.
        name_prefix: Start of every namespace name; :func:`cleanup_stale` finds
            leftovers by it. Must end with ``-``.
    """

    num_hosts: int
    ranks_per_host: int
    rate_mbit: float | None = DEFAULT_RATE_MBIT
    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    loss_percent: float = 0.0
    subnet: str = DEFAULT_SUBNET
    name_prefix: str = DEFAULT_NAME_PREFIX

    def __post_init__(self) -> None:
        for field in ("num_hosts", "ranks_per_host"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(
                    f"EmulationConfig.{field} must be a positive integer, got {value!r}; "
                    f"pass e.g. {field}=2"
                )
        if self.rate_mbit is not None:
            if isinstance(self.rate_mbit, bool) or not isinstance(self.rate_mbit, int | float):
                raise ConfigError(
                    f"EmulationConfig.rate_mbit must be a number or None, got {self.rate_mbit!r}"
                )
            if not 0.001 <= self.rate_mbit <= 1_000_000:
                raise ConfigError(
                    f"EmulationConfig.rate_mbit={self.rate_mbit!r} is outside 0.001..1000000 "
                    f"Mbit/s; use e.g. {DEFAULT_RATE_MBIT:g}, or None for an unshaped link"
                )
        if isinstance(self.delay_ms, bool) or not isinstance(self.delay_ms, int | float):
            raise ConfigError(f"EmulationConfig.delay_ms must be a number, got {self.delay_ms!r}")
        if not 0 <= self.delay_ms <= 10_000:
            raise ConfigError(
                f"EmulationConfig.delay_ms={self.delay_ms!r} must be within 0..10000 ms; use 0 "
                "for no delay"
            )
        for field, top in (("jitter_ms", self.delay_ms), ("loss_percent", 100.0)):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ConfigError(
                    f"EmulationConfig.{field} must be a number >= 0, got {value!r}; use 0 for none"
                )
            if value > top:
                limit = "delay_ms (a delay cannot go below 0)" if field == "jitter_ms" else "100"
                raise ConfigError(
                    f"EmulationConfig.{field}={value!r} is larger than {limit}; lower it"
                )
        network = self.network  # validates the subnet
        usable = network.num_addresses - 2
        if self.num_hosts > usable:
            raise ConfigError(
                f"subnet {self.subnet} has {usable} host addresses but "
                f"num_hosts={self.num_hosts}; use a larger subnet such as 10.77.0.0/16"
            )
        if not isinstance(self.name_prefix, str) or not _PREFIX_RE.match(self.name_prefix):
            raise ConfigError(
                f"EmulationConfig.name_prefix={self.name_prefix!r} must be a letter, up to 16 of "
                f"[A-Za-z0-9_.], then '-' (e.g. {DEFAULT_NAME_PREFIX!r})"
            )

    @property
    def network(self) -> ipaddress.IPv4Network:
        """The inter-host subnet, parsed."""
        try:
            network = ipaddress.ip_network(self.subnet, strict=True)
        except (TypeError, ValueError) as exc:
            raise ConfigError(
                f"EmulationConfig.subnet={self.subnet!r} is not a valid network ({exc}); "
                f"use e.g. {DEFAULT_SUBNET!r}"
            ) from None
        if not isinstance(network, ipaddress.IPv4Network) or network.prefixlen > 30:
            raise ConfigError(
                f"EmulationConfig.subnet={self.subnet!r} must be an IPv4 network of /30 or "
                f"larger, e.g. {DEFAULT_SUBNET!r}"
            )
        return network

    @property
    def world_size(self) -> int:
        """Total number of ranks."""
        return self.num_hosts * self.ranks_per_host

    def host_address(self, host: int) -> str:
        """The inter-host IPv4 address of ``host``."""
        if not 0 <= host < self.num_hosts:
            raise ConfigError(f"host {host} is outside a cluster of {self.num_hosts} hosts")
        return str(self.network.network_address + 1 + host)
