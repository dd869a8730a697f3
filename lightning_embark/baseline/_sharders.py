"""torchrec sharders for the baseline: every sharding type on CPU, fused kernels, qcomms.

torchrec's ``EmbeddingBagCollectionSharder`` offers only data-parallel, table-wise,
column-wise and table-column-wise sharding when the compute device is ``cpu``; the
row-based types (row-wise, table-row-wise, grid) are reserved for CUDA. They run on
CPU/gloo all the same (``tests/baseline/test_sharders.py`` checks each against an
unsharded collection), and the baseline must be able to use them: an emulated
multi-host cluster of CPU processes is compared against torchrec with the same
search space torchrec has on GPUs, or the comparison would be unfair to torchrec.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torchrec.distributed.embedding_types import ShardingType
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.fbgemm_qcomm_codec import (
    CommType,
    QCommsConfig,
    get_qcomm_codecs_registry,
)
from torchrec.distributed.types import ModuleSharder

from lightning_embark.baseline._towers import TowerCollectionSharder
from lightning_embark.errors import ConfigError

#: Sharding types torchrec keeps for CUDA only, which this sharder also allows on CPU.
ROW_BASED_SHARDING_TYPES: tuple[str, ...] = (
    ShardingType.ROW_WISE.value,
    ShardingType.TABLE_ROW_WISE.value,
    ShardingType.GRID_SHARD.value,
)

#: ``qcomms`` names accepted by :func:`qcomms_config`, mapped to torchrec comm types.
QCOMMS_PRECISIONS: dict[str, CommType] = {
    "fp16": CommType.FP16,
    "bf16": CommType.BF16,
    "fp8": CommType.FP8,
    "int8": CommType.INT8,
}


class AllShardingTypesEBCSharder(EmbeddingBagCollectionSharder):
    """``EmbeddingBagCollectionSharder`` that also offers RW, TWRW and grid on CPU.

    On any other compute device the parent's answer is returned unchanged, so the
    sharder is a drop-in replacement on CUDA. Compute kernels are the parent's: the
    fused fbgemm TBE (optimizer applied in backward) for every sharded type, dense for
    data-parallel tables.
    """

    def sharding_types(self, compute_device_type: str) -> list[str]:
        """Sharding types the planner may choose on ``compute_device_type``."""
        types = list(super().sharding_types(compute_device_type))
        if compute_device_type == "cpu":
            types += [t for t in ROW_BASED_SHARDING_TYPES if t not in types]
        return types


def qcomms_config(qcomms: str | None) -> QCommsConfig | None:
    """The torchrec ``QCommsConfig`` for a precision name (same forward and backward).

    Args:
        qcomms: ``None`` or ``"fp32"`` for full-precision communication, otherwise a
            key of :data:`QCOMMS_PRECISIONS`.

    Raises:
        ConfigError: ``qcomms`` is not a known precision; the message lists them.
    """
    if qcomms is None or qcomms == "fp32":
        return None
    if qcomms not in QCOMMS_PRECISIONS:
        raise ConfigError(
            f"qcomms={qcomms!r} is not a supported precision; use None, 'fp32' or one of "
            f"{sorted(QCOMMS_PRECISIONS)}"
        )
    precision = QCOMMS_PRECISIONS[qcomms]
    return QCommsConfig(forward_precision=precision, backward_precision=precision)


def make_sharders(
    *,
    device: torch.device,
    fused_params: dict[str, Any] | None = None,
    qcomms: str | None = None,
) -> list[ModuleSharder[nn.Module]]:
    """The sharders the baseline hands to torchrec's planner and ``DistributedModelParallel``.

    Args:
        device: Compute device; quantized-comm codecs depend on it (torchrec falls back
            from BF16 to FP16 on gloo, for instance).
        fused_params: fbgemm TBE parameters, in particular the fused optimizer
            (``optimizer``, ``learning_rate``, ``eps``); per-table optimizer settings
            attached by ``apply_optimizer_in_backward`` take precedence over these.
        qcomms: Communication precision for the pooled-embedding all-to-all and
            reduce-scatter, forward and backward (see :func:`qcomms_config`).

    Returns:
        A sharder for ``EmbeddingBagCollection`` and one for torchrec's
        ``EmbeddingTowerCollection`` (torchrec's tower sharding, which torchrec leaves out
        of its default sharders: a model that holds towers gets torchrec's towers, one
        per host, rather than its towers' tables sharded as flat ones).
    """
    config = qcomms_config(qcomms)
    registry = (
        get_qcomm_codecs_registry(qcomms_config=config, device=device)
        if config is not None
        else None
    )
    params = dict(fused_params) if fused_params else None
    return [
        AllShardingTypesEBCSharder(fused_params=params, qcomm_codecs_registry=registry),
        TowerCollectionSharder(fused_params=params, qcomm_codecs_registry=registry),
    ]
