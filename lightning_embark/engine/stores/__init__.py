"""Where an owner's embedding blocks live and how they are looked up and updated.

One small base class (:class:`ShardStore`) and :func:`make_store`, which picks
fbgemm's table-batched kernels where they run (its CPU kernels on the CPU, its CUDA
kernels, with UVM caches for blocks the plan caches, on CUDA) and the plain-torch
store otherwise.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import torch

from lightning_embark.engine._optimizer import SparseOptimizer
from lightning_embark.engine.stores._base import (
    Bags,
    FlatBags,
    ShardStore,
    copy_optimizer_states,
    row_grads,
)
from lightning_embark.engine.stores._fbgemm_store import (
    FbgemmStore,
    block_locations,
    fbgemm_available,
    fbgemm_cuda_available,
    tbe_arguments,
    tbe_cache_load_factor,
)
from lightning_embark.engine.stores._torch_store import GroupedStore, TorchStore
from lightning_embark.errors import ConfigError

__all__ = [
    "Bags",
    "FbgemmStore",
    "FlatBags",
    "GroupedStore",
    "ShardStore",
    "TorchStore",
    "block_locations",
    "copy_optimizer_states",
    "fbgemm_available",
    "fbgemm_cuda_available",
    "make_store",
    "row_grads",
    "store_choice",
    "tbe_arguments",
    "tbe_cache_load_factor",
]


def store_choice(
    store: str,
    device_type: str,
    *,
    widths_fit: bool,
    fbgemm_cpu: bool,
    fbgemm_cuda: bool,
) -> str:
    """``"fbgemm"`` or ``"torch"``: the store :func:`make_store` builds, as a pure function
    of the store option, the device type and what runs there (testable anywhere).

    Args:
        store: ``"auto"``, ``"fbgemm"`` or ``"torch"``.
        device_type: The engine's device type.
        widths_fit: Every block width is a multiple of 4 (fbgemm's requirement).
        fbgemm_cpu: fbgemm's CPU kernels run here.
        fbgemm_cuda: fbgemm's CUDA kernels run on the device.

    Raises:
        ConfigError: an unknown store; ``"fbgemm"`` with widths it cannot run, or on a
            device where its kernels do not run (each names the value and the fix).
    """
    if store not in ("auto", "fbgemm", "torch"):
        raise ConfigError(f"store must be 'auto', 'fbgemm' or 'torch', got {store!r}")
    runs = {"cpu": fbgemm_cpu, "cuda": fbgemm_cuda}.get(device_type, False)
    if store == "fbgemm":
        if not widths_fit:
            raise ConfigError(
                "fbgemm's table-batched kernels need block widths that are multiples of 4; "
                "use fewer column shards or store='auto'/'torch'"
            )
        if device_type not in ("cpu", "cuda"):
            raise ConfigError(
                "store='fbgemm' runs fbgemm's CPU (host) kernels, or its CUDA kernels where "
                f"a CUDA build of fbgemm loads, but the engine's device is {device_type}; use "
                "store='torch' or 'auto' on that device"
            )
        if device_type == "cuda" and not runs:
            raise ConfigError(
                "store='fbgemm' on CUDA needs a CUDA build of fbgemm-gpu whose ops load "
                "here (the installed one has no CUDA kernels, or CUDA is not available); "
                "install fbgemm-gpu for this CUDA, or use store='auto'/'torch'"
            )
        return "fbgemm"
    if store == "auto" and widths_fit and runs:
        return "fbgemm"
    return "torch"


def make_store(
    store: str,
    shapes: Sequence[tuple[int, int]],
    optimizer: SparseOptimizer,
    *,
    batch_blocks: bool = True,
    device: torch.device | str = "cpu",
    cache_load_factors: Sequence[float | None] | None = None,
) -> ShardStore:
    """A store of the kind ``store`` names (``"fbgemm"``, ``"torch"`` or ``"auto"``),
    holding its blocks on ``device`` (the engine's).

    ``"auto"`` picks fbgemm when its kernels run on the device (its CPU kernels on the
    CPU, its CUDA kernels on CUDA: :func:`fbgemm_cuda_available`) and every block width
    is a multiple of 4 (fbgemm's requirement), the torch path otherwise
    (:func:`store_choice`). ``batch_blocks`` False gives every block its own fbgemm
    kernel (no padding to a common bag count). ``cache_load_factors`` (per block, the
    plan's ``cache_load_factor``) puts blocks below 1 in UVM behind an HBM cache on CUDA;
    the torch store has no cache and holds them wholly on the device (with a warning).
    The CUDA paths have not run on a GPU.

    Raises:
        ConfigError: an unknown store, fbgemm with widths it cannot run, fbgemm on a
            device where its kernels do not run, or factors not one per block.
    """
    device = torch.device(device)
    factors = list(cache_load_factors) if cache_load_factors is not None else [None] * len(shapes)
    if len(factors) != len(shapes):
        raise ConfigError(
            f"{len(factors)} cache load factors for {len(shapes)} blocks; give one per block "
            "(None for a block wholly in HBM)"
        )
    odd = [w for _, w in shapes if w % 4]
    if store == "fbgemm" and odd:
        raise ConfigError(
            "fbgemm's table-batched kernels need block widths that are multiples of 4, got "
            f"{odd}; use fewer column shards or store='auto'/'torch'"
        )
    wants = store in ("auto", "fbgemm")
    choice = store_choice(
        store,
        device.type,
        widths_fit=not odd,
        fbgemm_cpu=wants and device.type == "cpu" and fbgemm_available(),
        fbgemm_cuda=wants and device.type == "cuda" and fbgemm_cuda_available(device),
    )
    if choice == "fbgemm":
        if batch_blocks or len(shapes) < 2:
            return FbgemmStore(shapes, optimizer, device=device, cache_load_factors=factors)
        return GroupedStore(
            [
                FbgemmStore([shape], optimizer, device=device, cache_load_factors=[factor])
                for shape, factor in zip(shapes, factors, strict=True)
            ],
            [[i] for i in range(len(shapes))],
        )
    if device.type == "cuda" and any(f is not None and f < 1.0 for f in factors):
        warnings.warn(
            "the plan caches some blocks in UVM but fbgemm's CUDA kernels do not run here: "
            "the torch store holds them wholly in HBM, where they may not fit; install a "
            "CUDA build of fbgemm-gpu",
            stacklevel=2,
        )
    return TorchStore(shapes, optimizer, device=device)
