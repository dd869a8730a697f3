"""All of a calibration's measurements in one call (:func:`measure_all`); every rank calls it.

Links first (:mod:`~lightning_embark.calibration._link_probes`), then the compute probes
(:mod:`~lightning_embark.calibration._compute_probes`) on every rank at once, so that they
share the cores as a training step does; per-rank compute times are then pooled to the
median rank's.

Everything is measured on ``device`` (the CPU by default; ``cuda:<local rank>`` on GPUs,
where the process group must be NCCL's): the result records it with the backend, so that
a calibration says what it was measured with.
"""

from __future__ import annotations

import platform
import statistics
from collections.abc import Callable, Sequence
from typing import Any

from lightning_embark.calibration._compute_probes import (
    lookup_shapes,
    measure_codecs,
    measure_dense_matmul,
    measure_dp_dense,
    measure_engine_pieces,
    measure_lookup,
    measure_unique_pooling,
)
from lightning_embark.calibration._device import probe_backend, timer
from lightning_embark.calibration._link_probes import (
    DEFAULT_SIZES,
    allreduce_series,
    alltoall_series,
    hierarchical_series,
)
from lightning_embark.calibration._timing import host_groups, size_label, time_repeats
from lightning_embark.errors import ConfigError

MEASUREMENT_VERSION = 1


def measure_all(
    *,
    sizes: Sequence[int] = DEFAULT_SIZES,
    ranks_per_host: int,
    repeats: int = 5,
    lookup_rows: int = 100_000,
    lookup_batch: int = 2048,
    dim: int = 128,
    progress: Callable[[str], None] | None = None,
    device: Any = "cpu",
) -> dict:
    """Every measurement of a calibration; all ranks of the default group call this.

    Returns the same dict on every rank (collective times are the slowest rank's;
    lookup and codec times the median rank's, measured on all ranks at once so they
    share the cores as a training step does).

    Raises:
        ConfigError: no process group, or one whose backend cannot measure ``device``
            (gloo for the CPU, NCCL for CUDA; names both).
    """
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        raise ConfigError(
            "measure_all runs inside a process group; launch it with torchrun or run_gloo_ranks"
        )
    device = torch.device(device)
    backend, wanted = str(dist.get_backend()), probe_backend(device)
    if backend != wanted and f"{device.type}:{wanted}" not in backend.split(","):
        raise ConfigError(
            f"measuring on {device} needs a {wanted} process group, but this one is "
            f"{backend}; the engine exchanges {device.type} tensors over {wanted}"
        )
    backend = wanted
    rank, world = dist.get_rank(), dist.get_world_size()
    say = progress if (progress is not None and rank == 0) else (lambda _msg: None)
    intra_groups, inter_groups = host_groups(world, ranks_per_host)
    sizes = sorted({int(s) for s in sizes})
    if len(sizes) < 2 or sizes[0] < 4:
        raise ConfigError(f"--sizes needs at least two distinct sizes >= 4 bytes, got {sizes}")
    result: dict[str, Any] = {
        "version": MEASUREMENT_VERSION,
        "backend": backend,
        "device": device.type,
        "device_name": (
            torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()
        ),
        "world": world,
        "ranks_per_host": ranks_per_host,
        "num_hosts": world // ranks_per_host,
        "repeats": repeats,
    }
    result["alltoall_intra"] = alltoall_series(
        sizes, intra_groups, repeats=repeats, progress=say, label="intra-host", device=device
    )
    result["alltoall_inter"] = alltoall_series(
        sizes, inter_groups, repeats=repeats, progress=say, label="inter-host", device=device
    )
    result["allreduce"] = allreduce_series(sizes, repeats=repeats, progress=say, device=device)
    result["alltoall_hierarchical"] = hierarchical_series(
        sizes, ranks_per_host, repeats=repeats, progress=say, device=device
    )
    tiny = torch.ones(world, dtype=torch.float32, device=device)
    tiny_out = torch.empty_like(tiny)
    result["world_alltoall_tiny_s"] = time_repeats(
        lambda: dist.all_to_all_single(tiny_out, tiny),
        repeats=max(repeats, 10),
        clock=timer(device),
        device=device,
    )
    say(f"world all-to-all of 4 B per peer: {1e3 * result['world_alltoall_tiny_s']:.3f} ms")
    dist.barrier()
    shapes = lookup_shapes(lookup_batch, dim, lookup_rows)
    lookups = [
        measure_lookup(
            rows=n, dim=w, batch=b, hotness=h, repeats=repeats, seed=rank, device=device
        )
        for b, h, w, n in shapes
    ]
    unique_pooling = [
        measure_unique_pooling(
            rows=n, dim=w, batch=b, hotness=h, repeats=repeats, seed=rank, device=device
        )
        for b, h, w, n in shapes
    ]
    codecs = measure_codecs(dim=dim, repeats=repeats, seed=rank, device=device)
    dense = measure_dp_dense(repeats=repeats, device=device)
    matmul = measure_dense_matmul(repeats=repeats, device=device)
    gathered: list[Any] = [None] * world
    dist.all_gather_object(
        gathered,
        {
            "lookups": lookups,
            "unique_pooling": unique_pooling,
            "codecs": codecs,
            "dp_dense": dense,
            "dense_matmul": matmul,
        },
    )
    result["dp_dense"] = dict(
        dense, seconds=statistics.median(g["dp_dense"]["seconds"] for g in gathered)
    )
    say(
        f"DP dense gradient passes over {size_label(dense['bytes'])}: "
        f"{1e3 * result['dp_dense']['seconds']:.2f} ms"
    )
    result["dense_matmul"] = dict(
        matmul, seconds=statistics.median(g["dense_matmul"]["seconds"] for g in gathered)
    )
    say(
        f"dense matmul (a tower module's forward and backward): "
        f"{result['dense_matmul']['flops'] / result['dense_matmul']['seconds'] / 1e9:.1f} GFLOP/s"
    )
    for key, points in (("lookups", lookups), ("unique_pooling", unique_pooling)):
        result[key] = [
            dict(
                entry,
                forward_s=statistics.median(g[key][i]["forward_s"] for g in gathered),
                backward_s=statistics.median(g[key][i]["backward_s"] for g in gathered),
            )
            for i, entry in enumerate(points)
        ]
    result["codecs"] = {
        name: {
            key: (
                statistics.median(g["codecs"][name][key] for g in gathered)
                if key.endswith("_s")
                else value
            )
            for key, value in entry.items()
        }
        for name, entry in codecs.items()
    }
    result["engine"] = measure_engine_pieces(
        ranks_per_host=ranks_per_host, tables=16, repeats=max(3 * repeats, 6), device=device
    )
    eng = result["engine"]
    say(
        f"engine, {eng['tables']} tables x 16 samples: table-wise {1e3 * eng['table_wise_s']:.2f} "
        f"ms, row-wise {1e3 * eng['row_wise_s']:.2f} ms, table-wise fp16 "
        f"{1e3 * eng['table_wise_fp16_s']:.2f} ms, fp8 {1e3 * eng['table_wise_fp8_s']:.2f} ms; "
        f"{eng['hot']} IDs per bag: table-wise {1e3 * eng['table_wise_hot_s']:.2f} ms, row-wise "
        f"{1e3 * eng['row_wise_hot_s']:.2f} ms"
    )
    for lk in result["lookups"]:
        say(
            f"lookup ({lk['kernel']}, {lk['bags']} bags x {lk['ids'] // lk['bags']} ids x "
            f"{lk['dim']}, {lk['unique_rows']} of {lk['rows']} rows updated): forward "
            f"{1e3 * lk['forward_s']:.2f} ms, backward {1e3 * lk['backward_s']:.2f} ms"
        )
    for name, entry in result["codecs"].items():
        say(
            f"codec {name}: encode {entry['fp32_bytes'] / entry['encode_s'] / 1e9:.2f} GB/s, "
            f"decode {entry['fp32_bytes'] / entry['decode_s'] / 1e9:.2f} GB/s (fp32 bytes)"
        )
    return result
