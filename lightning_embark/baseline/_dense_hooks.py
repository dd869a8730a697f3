"""The baseline's DDP communication hooks: a chosen wire format, and traffic labels.

torchrec's ``DistributedModelParallel`` all-reduces the dense part's gradients with DDP
(``DefaultDataParallelWrapper``), in fp32, while ``strategy="embark"`` can send them in
bf16. A comparison is only fair with the same dense exchange on both sides, so the
baseline's dense DDP gets one of torch's stock hooks, ``allreduce_hook``,
``bf16_compress_hook`` or ``fp16_compress_hook`` (averaged in fp32, cast, all-reduced,
cast back), each called under the ``dense`` traffic label (:mod:`lightning_embark._traffic`)
so the byte counter keeps the dense gradients apart from the embedding exchange.

torchrec wraps two more kinds of module in DDP of their own, which are embedding traffic,
not dense: the lookups of data-parallel tables (their gradient all-reduce is what
``strategy="embark"``'s DP clusters do, unlabelled) and the tower modules of a sharded
tower collection (all-reduced inside a host, ``towers:modules`` as embark's towers label
theirs). They get fp32 all-reduce hooks with those labels; a DDP without a hook would be
labelled ``dense`` by the byte counter's fallback.

On gloo the stock bf16 hook cannot be registered as it is: DDP refuses any hook *named*
``bf16_compress_hook`` unless torch was built with CUDA and NCCL >= 2.10 (``TypeError``
"BF16 all reduce communication hook required CUDA 11+ and NCCL 2.10+ or XPU and XCCL",
``DistributedDataParallel._check_comm_hook``), although gloo all-reduces bfloat16 CPU
tensors (measured with torch 2.13: the hook under another name trains, and its gradients
match fp32's to bf16's 8 bits). The hooks here call the stock ones under their own names.
"""

# No ``from __future__ import annotations`` here: DDP inspects a hook's annotations at
# registration and requires the real ``dist.GradBucket`` class, not a string.
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from lightning_embark._traffic import traffic
from lightning_embark.errors import ConfigError

#: Wire formats of the dense gradients' all-reduce, as ``TorchrecStrategy`` names them.
DENSE_COMPRESSIONS: tuple[str, ...] = ("fp32", "bf16", "fp16")

Hook = Callable[[Any, dist.GradBucket], torch.futures.Future[torch.Tensor]]


def check_dense_compression(value: object, *, where: str) -> str:
    """``value`` if it is one of :data:`DENSE_COMPRESSIONS`.

    Raises:
        ConfigError: anything else, naming ``where`` the value came from.
    """
    if value not in DENSE_COMPRESSIONS:
        raise ConfigError(
            f"{where} dense_compression={value!r} is unknown; use one of "
            f"{list(DENSE_COMPRESSIONS)}"
        )
    assert isinstance(value, str)
    return value


def dense_fp32_hook(
    process_group: Any, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """DDP's own averaging all-reduce in fp32, counted as ``dense`` traffic."""
    with traffic("dense"):
        return default_hooks.allreduce_hook(process_group, bucket)


def dense_bf16_hook(
    process_group: Any, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """torch's ``bf16_compress_hook`` (under a name DDP accepts on gloo), ``dense`` traffic."""
    with traffic("dense"):
        return default_hooks.bf16_compress_hook(process_group, bucket)


def dense_fp16_hook(
    process_group: Any, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """torch's ``fp16_compress_hook``, counted as ``dense`` traffic."""
    with traffic("dense"):
        return default_hooks.fp16_compress_hook(process_group, bucket)


def dp_tables_hook(
    process_group: Any, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """The fp32 all-reduce of data-parallel tables' gradients: embedding traffic, unlabelled
    (as ``strategy="embark"``'s DP clusters)."""
    return default_hooks.allreduce_hook(process_group, bucket)


def tower_modules_hook(
    process_group: Any, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """The fp32 all-reduce of tower modules' gradients inside a host, ``towers:modules``."""
    with traffic("towers:modules"):
        return default_hooks.allreduce_hook(process_group, bucket)


_DENSE_HOOKS: dict[str, Hook] = {
    "fp32": dense_fp32_hook,
    "bf16": dense_bf16_hook,
    "fp16": dense_fp16_hook,
}


def dense_hook(compression: str) -> Hook:
    """The dense part's hook for a wire format of :data:`DENSE_COMPRESSIONS`."""
    return _DENSE_HOOKS[check_dense_compression(compression, where="dense_hook")]


def register_hook(ddp: DistributedDataParallel, hook: Hook) -> None:
    """``hook`` on ``ddp``, over the process group ``ddp`` reduces in (a tower module's
    DDP reduces inside its host, not over the world)."""
    ddp.register_comm_hook(ddp.process_group, hook)
