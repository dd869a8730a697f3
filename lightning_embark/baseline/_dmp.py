"""Turning a LightningModule into torchrec's ``DistributedModelParallel``.

Small pure steps the strategy calls in order: validate the trainer options that fused
optimizers cannot honour, attach the sparse optimizer to the embedding weights so
torchrec fuses it into the TBE backward, and wrap the module with DMP (sharded
embeddings, DDP over everything else).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.optim import _apply_optimizer_in_backward
from torchrec.distributed.model_parallel import (
    DefaultDataParallelWrapper,
    DistributedModelParallel,
)
from torchrec.distributed.types import ModuleSharder, ShardedModule, ShardingEnv, ShardingPlan
from torchrec.modules.embedding_tower import EmbeddingTowerCollection

from lightning_embark.baseline._sharders import QCOMMS_PRECISIONS
from lightning_embark.errors import ConfigError
from lightning_embark.models import ShardableModule, SparseOptimizerSpec

log = logging.getLogger(__name__)

#: Quantized-comm precisions whose fbgemm codecs fail on CPU/gloo in torchrec 1.8 /
#: fbgemm-gpu-cpu 1.8 (measured): INT8 reduce-scatter has no quantization context
#: ("Unexpected `None`"), FP8 calls FloatToHFP8Quantized on a 1-D buffer, which the
#: CPU op rejects ("must have 2 dimension(s)").
CPU_BROKEN_QCOMMS = ("int8", "fp8")


def check_qcomms_device(qcomms: str | None, device: torch.device) -> None:
    """Refuse quantized comms known to fail on the CPU codecs, naming the fix."""
    if device.type == "cpu" and qcomms in CPU_BROKEN_QCOMMS:
        working = sorted(set(QCOMMS_PRECISIONS) - set(CPU_BROKEN_QCOMMS))
        raise ConfigError(
            f"qcomms={qcomms!r} does not run on CPU/gloo with fbgemm-gpu-cpu (its codec fails "
            f"in the pooled-embedding exchange); use one of {working} or None"
        )


def as_shardable(module: nn.Module) -> ShardableModule:
    """``module`` checked against :class:`ShardableModule`.

    Raises:
        ConfigError: a method is missing, or the module has no embedding collection.
    """
    if not isinstance(module, ShardableModule):
        missing = [
            m for m in ("embedding_modules", "sparse_optimizer_spec") if not hasattr(module, m)
        ]
        raise ConfigError(
            f"{type(module).__name__} cannot be sharded by torchrec: it lacks {missing} "
            "(see lightning_embark.models.ShardableModule; DLRMModule implements it)"
        )
    embedding_modules = module.embedding_modules()
    if not embedding_modules:
        raise ConfigError(
            f"{type(module).__name__}.embedding_modules() returned no module to shard"
        )
    sharded = [path for path, m in embedding_modules.items() if isinstance(m, ShardedModule)]
    if sharded:
        raise ConfigError(
            f"{type(module).__name__} was already sharded by an earlier Trainer ({sharded}); "
            "call validate/test/predict on the Trainer that fitted it, or build a new module"
        )
    return module


def apply_sparse_optimizer(modules: Iterable[nn.Module], spec: SparseOptimizerSpec) -> None:
    """Attach the sparse optimizer to every embedding weight, to run in backward.

    torchrec's sharders read the attached class and kwargs (``_optimizer_classes``,
    ``_optimizer_kwargs``) and build fused fbgemm TBEs with that optimizer; the
    planner only picks the fused kernel for weights marked this way. Marked weights
    are also what ``in_backward_optimizer_filter`` leaves out of the dense optimizer.
    The tower modules of an ``EmbeddingTowerCollection`` are dense layers, not tables:
    only its towers' embedding collections get the sparse optimizer.
    """
    params = [p for module in modules for table in _tables(module) for p in table.parameters()]
    if any(hasattr(p, "_in_backward_optimizers") for p in params):
        return
    _apply_optimizer_in_backward(spec.optimizer_class, params, spec.optimizer_kwargs)


def _tables(module: nn.Module) -> list[nn.Module]:
    """The modules that hold ``module``'s tables: a tower collection's towers' embedding
    collections (its tower modules are dense layers), else ``module`` itself."""
    if isinstance(module, EmbeddingTowerCollection):
        return [tower.embedding for tower in module.towers]
    return [module]


def sync_local_world_size(ranks_per_host: int) -> None:
    """Make ``LOCAL_WORLD_SIZE`` agree with the plan's ranks per host.

    torchrec plans with the topology it is given but, when it shards, builds its
    intra-host and cross-host process groups (table-row-wise, grid) from the
    ``LOCAL_WORLD_SIZE`` environment variable; a mismatch crashes the sharding.
    """
    current = os.environ.get("LOCAL_WORLD_SIZE")
    if current != str(ranks_per_host):
        if current:
            log.info(
                "LOCAL_WORLD_SIZE %s -> %d to match the plan's topology", current, ranks_per_host
            )
        os.environ["LOCAL_WORLD_SIZE"] = str(ranks_per_host)


def shard_module(
    module: nn.Module,
    *,
    plan: ShardingPlan,
    sharders: list[ModuleSharder[nn.Module]],
    device: torch.device,
    pg: dist.ProcessGroup,
    static_graph: bool = True,
    find_unused_parameters: bool = False,
) -> DistributedModelParallel:
    """Wrap ``module`` in DMP: embedding collections sharded in place, DDP over the rest.

    The module object itself stays the one Lightning knows (DMP replaces its embedding
    children with sharded ones and allocates meta tensors on ``device``); only the
    wrapper is new.
    """
    return DistributedModelParallel(
        module,
        env=ShardingEnv.from_process_group(pg),
        device=device,
        plan=plan,
        sharders=sharders,
        init_data_parallel=True,
        data_parallel_wrapper=DefaultDataParallelWrapper(
            static_graph=static_graph, find_unused_parameters=find_unused_parameters
        ),
    )
