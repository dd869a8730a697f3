"""The per-rank worker that ``embark-calibrate`` launches under torchrun on every host.

Run by path (:func:`worker_script`), every rank measures together with the others
(:func:`~lightning_embark.calibration._probes.measure_all`) and rank 0 writes the raw
measurements as JSON, which
:func:`~lightning_embark.calibration._from_measurements.build_calibration` then fits.

``--device cuda`` measures on GPUs: one rank per GPU (``LOCAL_RANK`` picks it), an NCCL
process group, every probe on that GPU. On a cluster of GPU hosts, run it under your own
torchrun on every host and fit its output with ``embark-calibrate --from-raw``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from lightning_embark.calibration._device import probe_backend
from lightning_embark.calibration._probes import DEFAULT_SIZES, measure_all
from lightning_embark.errors import ConfigError
from lightning_embark.lists import list_items

if TYPE_CHECKING:
    import torch


def machine_memory_per_rank(world: int) -> float | None:
    """This machine's RAM over ``world`` ranks (every emulated host shares it)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / max(1, world)
    except (ValueError, OSError, AttributeError):
        return None


def rank_device(kind: str, local_rank: int | str | None) -> torch.device:
    """This rank's device: the CPU, or GPU ``LOCAL_RANK`` of its host (one rank per GPU,
    as the engine runs).

    Raises:
        ConfigError: ``cuda`` without a ``LOCAL_RANK`` (not launched by torchrun), or an
            unknown kind.
    """
    import torch

    if kind == "cpu":
        return torch.device("cpu")
    if kind != "cuda":
        raise ConfigError(f"--device must be 'cpu' or 'cuda' in the worker, got {kind!r}")
    if local_rank is None or str(local_rank).strip() == "":
        raise ConfigError(
            "--device cuda needs LOCAL_RANK (one rank per GPU); launch the worker with torchrun"
        )
    return torch.device("cuda", int(local_rank))


def worker_main(argv: list[str] | None = None) -> int:
    """One rank under torchrun: measure, and on rank 0 write the raw JSON to ``--out``."""
    parser = argparse.ArgumentParser(description="embark-calibrate worker (one rank)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--sizes", default=",".join(str(s) for s in DEFAULT_SIZES))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--lookup-rows", type=int, default=100_000)
    parser.add_argument("--lookup-batch", type=int, default=2048)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="measure on the CPU (gloo) or on this rank's GPU (NCCL, one rank per GPU)",
    )
    args = parser.parse_args(argv)
    import torch
    import torch.distributed as dist

    from lightning_embark.topology import ranks_per_host_from_env

    torch.set_num_threads(1)
    device = rank_device(args.device, os.environ.get("LOCAL_RANK"))
    if device.type == "cuda":
        torch.cuda.set_device(device)  # NCCL and all_gather_object use the current device
    dist.init_process_group(probe_backend(device))
    try:
        world = dist.get_world_size()
        result = measure_all(
            sizes=parse_sizes(args.sizes),
            ranks_per_host=ranks_per_host_from_env(world),
            repeats=args.repeats,
            lookup_rows=args.lookup_rows,
            lookup_batch=args.lookup_batch,
            dim=args.dim,
            progress=lambda msg: print(f"[embark-calibrate] {msg}", flush=True),
            device=device,
        )
        if dist.get_rank() == 0:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(result, indent=2))
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


def parse_sizes(text: str | Sequence[int]) -> list[int]:
    """``"4K,64K,1M"`` (K/M/G binary suffixes, or plain bytes) to sorted distinct byte counts."""
    if not isinstance(text, str):
        return sorted({int(s) for s in text})
    out = set()
    for item in list_items(text):
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(item[-1].upper(), 1)
        number = item[:-1] if scale > 1 else item
        try:
            value = float(number) * scale
        except ValueError:
            raise ConfigError(
                f"--sizes item {item!r} is not a byte count like 4096, 64K or 4M"
            ) from None
        if not math.isfinite(value) or value < 4:
            raise ConfigError(f"--sizes item {item!r} must be at least 4 bytes")
        out.add(int(value))
    if len(out) < 2:
        raise ConfigError(
            f"--sizes needs at least two distinct sizes to fit latency and bandwidth, got {text!r}"
        )
    return sorted(out)


def worker_script() -> Path:
    """This module's file: ``embark-calibrate`` runs it under torchrun as the per-rank worker."""
    return Path(__file__).resolve()


if __name__ == "__main__":
    sys.exit(worker_main())
