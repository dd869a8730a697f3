"""Constants of the cost model: link alpha-beta, lookup and codec throughput, memory.

A :class:`Calibration` is what ``embark-plan --topology`` reads: a preset name or a
JSON file with these fields. The ``dgx-h100`` / ``dgx-h200`` presets come from
datasheet figures (docs/architecture.md#hardware-figures) plus stated assumptions, and say so in
``source``; the ``emulated`` preset holds what was measured on the emulated cluster
(docs/architecture.md#the-emulated-cluster). A calibration is shape-free: hosts and ranks per host
come
from the command line, so one file serves every cluster size of that hardware.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightning_embark._dictconfig import DictConfig
from lightning_embark.errors import ConfigError
from lightning_embark.topology import Topology, topology_preset

CALIBRATION_VERSION = 1


@dataclass(frozen=True, kw_only=True)
class Calibration(DictConfig):
    """Hardware constants; bandwidths are bytes/s per rank and direction, times seconds.

    Attributes:
        name: Preset or label.
        source: Where the numbers come from ("datasheet: ...", "measured: ...").
        ranks_per_host: The hardware's ranks per host (a default for the CLI).
        memory_per_rank: Bytes for embeddings, optimizer state and buffers per rank.
        intra_bandwidth: All-to-all bandwidth between ranks of one host.
        inter_bandwidth: All-to-all bandwidth of one rank to other hosts.
        intra_latency: Per-peer message latency inside a host.
        inter_latency: Per-peer message latency across hosts.
        hierarchical_inter_efficiency: Bytes/s of a hierarchical exchange's inter-host
            stage as a fraction of ``inter_bandwidth``, measured through whole two-stage
            exchanges (0.69-0.79 on the TCP-emulated cluster, where the one-peer stage behind
            an intra-host stage moves bytes slower than a flat exchange); 1 where not measured.
        allreduce_bandwidth: Ring all-reduce bus bandwidth when the ring crosses hosts
            (inside one host the intra bandwidth is used).
        allreduce_latency: Fixed seconds of one all-reduce call over the world (measured:
            the intercept of the all-reduce fit, so it holds for the calibrated cluster's
            size); None derives it from the per-peer latencies of the ring's
            ``2 (world - 1)`` steps.
        lookup_bandwidth: Bytes/s of random embedding-row reads (HBM times an
            efficiency for gathers of short rows).
        backward_lookup_factor: Backward (gradient scatter plus optimizer update) cost
            relative to the forward gather of the same rows.
        lookup_bag_seconds: Forward plus backward seconds per pooled bag (per sample
            and block served), beyond the bytes read: what dominates narrow rows on CPUs.
        lookup_id_seconds: Forward plus backward seconds per ID looked up, beyond the
            bytes read.
        update_row_seconds: Backward seconds per distinct row a block updates in a step
            (gradient aggregation and the sparse optimizer's read-modify-write of the row
            and its state): on CPUs this, not the IDs, is what hot tables cost, since
            repeated IDs update one row once.
        unique_pool_bag_seconds: A UB requester's own work per bag (it pools locally).
        unique_pool_id_seconds: The same per ID: de-duplication (``torch.unique``), pooling
            from the unique rows and the backward's per-unique-row gradient sum.
        unique_pool_row_seconds: The same per unique row.
        unique_pool_bandwidth: The same in bytes/s over the IDs' rows (IDs x width x 4);
            None costs the requester's work as a lookup of the same IDs (the datasheet
            presets, where the per-ID work is a fused kernel).
        route_id_seconds: Seconds a requester spends per ID it routes to the row shards of
            a row-split table (shard of each ID, grouping by destination, and the
            reverse on the way back); table-wise and column-split tables need none.
        piece_seconds: Fixed seconds per exchanged piece (one block's share for one
            requester), counted at the requester and at the owner, forward and backward
            together: splitting, routing and assembling work that does not scale with bytes.
        codec_piece_seconds: Fixed seconds per piece of an fp8 or int8 cluster (row-wise
            scaled codecs) for encoding and decoding it, forward and backward together.
        cast_piece_seconds: The same for fp16 and bf16 (plain casts).
        dp_dense_bandwidth: Bytes/s of a DP cluster's dense gradient passes over its
            tables each step (zero-fill, scatter-add, scan for touched rows), beyond the
            all-reduce; None leaves them out (GPUs, where they are negligible).
        codec_bandwidth: fp32 bytes/s a quantising codec (fp8, int8; fp16 and bf16 too
            unless ``cast_codec_bandwidth`` is set) encodes or decodes.
        cast_codec_bandwidth: fp32 bytes/s of the plain-cast codecs (fp16, bf16); None
            uses ``codec_bandwidth``.
        int8_codec_bandwidth: fp32 bytes/s of the int8 codec when it differs from fp8's
            (on CPUs its quantise is several passes slower); None uses ``codec_bandwidth``.
        dense_flops: fp32 FLOP/s of one rank's dense matmuls (a tower module's forward
            and backward), as the ranks train (sharing cores where they do); None: tower
            modules' compute is not priced.
        kernel_overhead: Fixed seconds per exchanged cluster and step (launches, syncs).
        weight_bytes: Bytes per stored embedding element.
        optimizer_bytes_per_element: Optimizer state per element (0 for SGD and
            row-wise Adagrad, 8 for Adam).
        optimizer_bytes_per_row: Optimizer state per row (4 for row-wise Adagrad).
        buffer_factor: Exchange buffers held at once, in units of one step's bytes received.
        host_link_bandwidth: Bytes/s per rank and direction between its accelerator and
            host memory (PCIe or NVLink-C2C): what a UVM-cached block's misses move (fbgemm
            ``MANAGED_CACHING``). None (CPUs, which have no HBM/UVM split, and hand-written
            files) disables UVM caching in the planner.
        host_memory_per_rank: Host (UVM) bytes per rank for cached blocks; the planner
            caches only where it and ``host_link_bandwidth`` are set and it exceeds
            ``memory_per_rank``.
        fit_rel_rms: How well each fitted term matched its measurements, as
            ``embark-calibrate`` fitted it: term (``alltoall_intra``, ``alltoall_inter``,
            ``allreduce``, ``lookup``, ``unique_pooling``) -> root-mean-square relative
            error over its points (0.05 is 5%). Empty for presets and hand-written files;
            the planner does not read it. A refit from a study keeps its base's figures.
    """

    name: str = "custom"
    source: str = ""
    ranks_per_host: int = 8
    memory_per_rank: float | None = None
    intra_bandwidth: float
    inter_bandwidth: float
    intra_latency: float = 0.0
    inter_latency: float = 0.0
    hierarchical_inter_efficiency: float = 1.0
    allreduce_bandwidth: float | None = None
    allreduce_latency: float | None = None
    lookup_bandwidth: float
    backward_lookup_factor: float = 2.0
    lookup_bag_seconds: float = 0.0
    lookup_id_seconds: float = 0.0
    update_row_seconds: float = 0.0
    unique_pool_bag_seconds: float = 0.0
    unique_pool_id_seconds: float = 0.0
    unique_pool_row_seconds: float = 0.0
    unique_pool_bandwidth: float | None = None
    route_id_seconds: float = 0.0
    piece_seconds: float = 0.0
    codec_piece_seconds: float = 0.0
    cast_piece_seconds: float = 0.0
    dp_dense_bandwidth: float | None = None
    codec_bandwidth: float = 1e12
    cast_codec_bandwidth: float | None = None
    int8_codec_bandwidth: float | None = None
    dense_flops: float | None = None
    kernel_overhead: float = 0.0
    weight_bytes: float = 4.0
    optimizer_bytes_per_element: float = 0.0
    optimizer_bytes_per_row: float = 4.0
    buffer_factor: float = 1.0
    host_link_bandwidth: float | None = None
    host_memory_per_rank: float | None = None
    fit_rel_rms: dict[str, float] = dataclasses.field(default_factory=dict)
    version: int = CALIBRATION_VERSION

    def __post_init__(self) -> None:
        if self.version != CALIBRATION_VERSION:
            raise ConfigError(
                f"calibration version {self.version} unsupported; this build reads "
                f"{CALIBRATION_VERSION}"
            )
        positive = (
            "intra_bandwidth",
            "inter_bandwidth",
            "lookup_bandwidth",
            "codec_bandwidth",
            "weight_bytes",
            "hierarchical_inter_efficiency",
        )
        for name in positive:
            if not getattr(self, name) > 0:
                raise ConfigError(f"Calibration.{name} must be > 0, got {getattr(self, name)!r}")
        non_negative = (
            "intra_latency",
            "inter_latency",
            "backward_lookup_factor",
            "kernel_overhead",
            "lookup_bag_seconds",
            "lookup_id_seconds",
            "update_row_seconds",
            "route_id_seconds",
            "unique_pool_bag_seconds",
            "unique_pool_id_seconds",
            "unique_pool_row_seconds",
            "piece_seconds",
            "codec_piece_seconds",
            "cast_piece_seconds",
            "optimizer_bytes_per_element",
            "optimizer_bytes_per_row",
            "buffer_factor",
        )
        for name in non_negative:
            if not getattr(self, name) >= 0:
                raise ConfigError(f"Calibration.{name} must be >= 0, got {getattr(self, name)!r}")
        if not isinstance(self.ranks_per_host, int) or self.ranks_per_host < 1:
            raise ConfigError(
                "Calibration.ranks_per_host must be a positive integer, got "
                f"{self.ranks_per_host!r}"
            )
        if self.memory_per_rank is not None and not self.memory_per_rank > 0:
            raise ConfigError(
                "Calibration.memory_per_rank must be > 0 bytes or null, got "
                f"{self.memory_per_rank!r}"
            )
        for name in (
            "cast_codec_bandwidth",
            "int8_codec_bandwidth",
            "unique_pool_bandwidth",
            "host_link_bandwidth",
            "host_memory_per_rank",
        ):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ConfigError(f"Calibration.{name} must be > 0 or null, got {value!r}")
        if self.dp_dense_bandwidth is not None and not self.dp_dense_bandwidth > 0:
            raise ConfigError(
                "Calibration.dp_dense_bandwidth must be > 0 or null, got "
                f"{self.dp_dense_bandwidth!r}"
            )
        if self.allreduce_latency is not None and not self.allreduce_latency >= 0:
            raise ConfigError(
                "Calibration.allreduce_latency must be >= 0 or null, got "
                f"{self.allreduce_latency!r}"
            )
        if not isinstance(self.fit_rel_rms, dict) or not all(
            isinstance(k, str)
            and not isinstance(v, bool)
            and isinstance(v, (int, float))
            and math.isfinite(v)
            and v >= 0
            for k, v in self.fit_rel_rms.items()
        ):
            raise ConfigError(
                "Calibration.fit_rel_rms must map term names to finite errors >= 0 (e.g. "
                f'{{"lookup": 0.07}}), got {self.fit_rel_rms!r}'
            )
        if self.allreduce_bandwidth is not None and not self.allreduce_bandwidth > 0:
            raise ConfigError(
                "Calibration.allreduce_bandwidth must be > 0 or null, got "
                f"{self.allreduce_bandwidth!r}"
            )

    @property
    def bytes_per_element(self) -> float:
        """Stored bytes per element that :meth:`Plan.validate` should assume."""
        return self.weight_bytes + self.optimizer_bytes_per_element

    def topology(self, *, num_hosts: int, ranks_per_host: int | None = None) -> Topology:
        """The :class:`Topology` of a cluster of this hardware."""
        return Topology(
            name=self.name,
            num_hosts=num_hosts,
            ranks_per_host=ranks_per_host or self.ranks_per_host,
            memory_per_rank=None if self.memory_per_rank is None else int(self.memory_per_rank),
            intra_host_bandwidth=self.intra_bandwidth,
            inter_host_bandwidth=self.inter_bandwidth,
            intra_host_latency=self.intra_latency,
            inter_host_latency=self.inter_latency,
            source=self.source,
        )

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2))

    @classmethod
    def load(cls, path: str | Path) -> Calibration:
        try:
            return cls.from_dict(json.loads(Path(path).read_text()))
        except (OSError, json.JSONDecodeError) as error:
            raise ConfigError(f"cannot read calibration {str(path)!r}: {error}") from error


def _from_topology(name: str, **extra: Any) -> Calibration:
    topo = topology_preset(name)
    return Calibration(
        name=name,
        ranks_per_host=topo.ranks_per_host,
        memory_per_rank=topo.memory_per_rank,
        intra_bandwidth=topo.intra_host_bandwidth,
        inter_bandwidth=topo.inter_host_bandwidth,
        intra_latency=topo.intra_host_latency,
        inter_latency=topo.inter_host_latency,
        **extra,
    )


#: Datasheet figures for UVM caching on DGX H100 / H200 (not measured here): each GPU
#: reaches host memory over PCIe Gen5 x16, 64 GB/s per direction (NVIDIA H100 SXM
#: datasheet: "PCIe Gen5: 128 GB/s", both directions together); the DGX H100 / H200
#: datasheets give 2 TB of system memory for 8 GPUs, 256 GB per GPU.
_DGX_HOST_LINK_BANDWIDTH = 64e9
_DGX_HOST_MEMORY_PER_RANK = 2e12 / 8


def _dgx(name: str, memory: str, hbm_bandwidth: float) -> Calibration:
    """A DGX preset from its datasheet: row gathers at an assumed 40% of HBM bandwidth,
    codecs (streaming reads and writes) at 50%, 20 us per kernel launch, fp32 matmuls at
    an assumed 70% of the 67 TFLOP/s fp32 peak (torch's default matmul precision uses
    no TF32); UVM cache misses at the PCIe Gen5 datasheet rate with no efficiency
    assumed (:data:`_DGX_HOST_LINK_BANDWIDTH`)."""
    return _from_topology(
        name,
        source=f"datasheet: NVLink 450 GB/s and 400 Gb/s NIC per GPU and direction, {memory} "
        f"{hbm_bandwidth / 1e12:g} TB/s with an assumed 40% efficiency for row gathers; fp32 "
        "matmuls at 70% of 67 TFLOP/s; fp32 weights, row-wise Adagrad; UVM cache misses over "
        "PCIe Gen5 x16 at 64 GB/s per direction, 2 TB host memory per 8 GPUs",
        lookup_bandwidth=0.4 * hbm_bandwidth,
        codec_bandwidth=0.5 * hbm_bandwidth,
        dense_flops=0.7 * 67e12,
        kernel_overhead=20e-6,
        host_link_bandwidth=_DGX_HOST_LINK_BANDWIDTH,
        host_memory_per_rank=_DGX_HOST_MEMORY_PER_RANK,
    )


_PRESETS = {
    "dgx-h100": lambda: _dgx("dgx-h100", "HBM3", 3.35e12),
    "dgx-h200": lambda: _dgx("dgx-h200", "HBM3e", 4.8e12),
    "emulated": lambda: _from_topology(
        "emulated",
        source="measured: links gloo all-to-all over loopback ~0.9 GB/s, tc-shaped veth ~55 MB/s "
        "(docs/architecture.md#the-emulated-cluster); compute by embark-calibrate on a 2-core "
        "CPU machine (2 hosts x 2 ranks, 400 Mbit/s, 2026-12-03): fbgemm TBE lookups 14 ns/ID + "
        "736 ns/row updated + 8.4 GB/s read, 265 us per exchanged piece, fp16/bf16 +17 us, "
        "fp8/int8 +265 us, 106 ns per ID routed to row shards, codecs 1.66 GB/s (fp8), 0.71 GB/s "
        "(int8) and 9.8 GB/s (fp16/bf16), DP dense passes 0.29 GB/s; all-reduce 4 ms per call "
        "(median of three calibrations: 1.9, 4.0, 4.2 ms); a hierarchical exchange's inter-host "
        "stage at 0.79x the link's rate (whole two-stage exchanges, 2026-12-03); UB requesters "
        "56 ns/ID + 58 ns/unique row + 8.0 GB/s (their own de-duplication, pooling and gradient "
        "sum); fp32 matmuls 40 GFLOP/s per rank with 4 ranks on the 2 cores (39-42, 83 alone; "
        "measure_dense_matmul, AMD EPYC, 2026-12-04)",
        allreduce_latency=4e-3,
        hierarchical_inter_efficiency=0.79,
        lookup_bandwidth=8.4e9,
        backward_lookup_factor=0.0,
        lookup_id_seconds=14e-9,
        update_row_seconds=736e-9,
        route_id_seconds=106e-9,
        unique_pool_id_seconds=56e-9,
        unique_pool_row_seconds=58e-9,
        unique_pool_bandwidth=8.0e9,
        piece_seconds=265e-6,
        codec_piece_seconds=265e-6,
        cast_piece_seconds=17e-6,
        dp_dense_bandwidth=0.29e9,
        codec_bandwidth=1.66e9,
        int8_codec_bandwidth=0.71e9,
        cast_codec_bandwidth=9.8e9,
        dense_flops=40e9,
    ),
}


def calibration_names() -> list[str]:
    return sorted(_PRESETS)


def calibration_for_topology(topology: Topology) -> Calibration:
    """The calibration of a run's :class:`Topology`: the preset of its name (else
    ``emulated``, the CPU figures measured here) for compute and memory constants, with
    the topology's own link bandwidths, latencies and memory per rank."""
    base = _PRESETS.get(topology.name, _PRESETS["emulated"])()
    return dataclasses.replace(
        base,
        ranks_per_host=topology.ranks_per_host,
        memory_per_rank=topology.memory_per_rank,
        intra_bandwidth=topology.intra_host_bandwidth,
        inter_bandwidth=topology.inter_host_bandwidth,
        intra_latency=topology.intra_host_latency,
        inter_latency=topology.inter_host_latency,
        source=base.source
        + (f"; links from topology {topology.name!r}" if topology.name != base.name else ""),
    )


def load_calibration(preset_or_path: str | Path) -> Calibration:
    """A preset (``dgx-h100``, ``dgx-h200``, ``emulated``) or a calibration JSON file."""
    name = str(preset_or_path)
    if name in _PRESETS:
        return _PRESETS[name]()
    if Path(name).is_file():
        return Calibration.load(name)
    raise ConfigError(
        f"--topology {name!r} is neither a preset {calibration_names()} nor a calibration file"
    )
