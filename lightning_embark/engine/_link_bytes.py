"""Bytes of one step per rank, split by link class (what the byte counter measures)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, kw_only=True)
class LinkBytes:
    """Bytes one rank sends to peers on its host and on other hosts."""

    intra: int = 0
    inter: int = 0

    def __add__(self, other: LinkBytes) -> LinkBytes:
        return LinkBytes(intra=self.intra + other.intra, inter=self.inter + other.inter)


@dataclass(frozen=True, kw_only=True)
class StepBytes:
    """One rank's bytes for one step, in total and per cluster."""

    forward: LinkBytes
    backward: LinkBytes
    by_cluster: dict[str, tuple[LinkBytes, LinkBytes]] = field(default_factory=dict)


def link(src: int, dst: int, num_bytes: int, local: int) -> LinkBytes:
    """``num_bytes`` from ``src`` to ``dst``, on the link class between them."""
    if src == dst or num_bytes == 0:
        return LinkBytes()
    if src // local == dst // local:
        return LinkBytes(intra=num_bytes)
    return LinkBytes(inter=num_bytes)
