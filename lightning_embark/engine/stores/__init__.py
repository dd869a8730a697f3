"""Where an owner's embedding blocks live and how they are looked up and updated.

One small base class (:class:`ShardStore`) and :func:`make_store`, which picks
fbgemm's table-batched kernels where they run and the plain-torch store otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from lightning_embark.engine._optimizer import SparseOptimizer
from lightning_embark.engine.stores._base import Bags, ShardStore, copy_optimizer_states, row_grads
from lightning_embark.engine.stores._fbgemm_store import FbgemmStore, fbgemm_available
from lightning_embark.engine.stores._torch_store import GroupedStore, TorchStore
from lightning_embark.errors import ConfigError

__all__ = [
    "Bags",
    "FbgemmStore",
    "GroupedStore",
    "ShardStore",
    "TorchStore",
    "copy_optimizer_states",
    "fbgemm_available",
    "make_store",
    "row_grads",
]


def make_store(
    kernel: str,
    shapes: Sequence[tuple[int, int]],
    optimizer: SparseOptimizer,
    *,
    batch_blocks: bool = True,
    device: torch.device | str = "cpu",
) -> ShardStore:
    """A store of ``kernel``: ``"fbgemm"``, ``"torch"`` or ``"auto"``, holding its blocks on
    ``device`` (the engine's).

    ``"auto"`` picks fbgemm when its CPU kernels run here, the device is the CPU and every
    block width is a multiple of 4 (fbgemm's requirement), the torch path otherwise.
    ``batch_blocks`` False gives every block its own fbgemm kernel (no padding to a
    common bag count).

    Raises:
        ConfigError: an unknown kernel, fbgemm with widths it cannot run, or fbgemm on
            another device than the CPU (the store drives fbgemm's host kernels only).
    """
    if kernel not in ("auto", "fbgemm", "torch"):
        raise ConfigError(f"kernel must be 'auto', 'fbgemm' or 'torch', got {kernel!r}")
    device = torch.device(device)
    odd = [w for _, w in shapes if w % 4]
    if kernel == "fbgemm" and odd:
        raise ConfigError(
            "fbgemm's table-batched kernels need block widths that are multiples of 4, got "
            f"{odd}; use fewer column shards or kernel='auto'/'torch'"
        )
    on_host = device.type == "cpu"
    if kernel == "fbgemm" and not on_host:
        raise ConfigError(
            f"kernel='fbgemm' runs fbgemm's CPU (host) kernels only, but the engine's device is "
            f"{device}; use kernel='torch' or 'auto' on that device"
        )
    if kernel == "fbgemm" or (kernel == "auto" and on_host and not odd and fbgemm_available()):
        if batch_blocks or len(shapes) < 2:
            return FbgemmStore(shapes, optimizer)
        return GroupedStore(
            [FbgemmStore([shape], optimizer) for shape in shapes],
            [[i] for i in range(len(shapes))],
        )
    return TorchStore(shapes, optimizer, device=device)
