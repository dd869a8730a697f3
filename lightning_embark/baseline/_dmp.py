"""Turning a LightningModule into torchrec's ``DistributedModelParallel``.

Small pure steps the strategy calls in order: validate the trainer options that fused
optimizers cannot honour, attach the sparse optimizer to the embedding weights so
torchrec fuses it into the TBE backward, and wrap the module with DMP (sharded
embeddings, DDP over everything else, with the dense gradients' wire format and traffic
labels of :mod:`._dense_hooks`).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.optim import _apply_optimizer_in_backward
from torch.nn.parallel import DistributedDataParallel
from torchrec.distributed.embedding_tower_sharding import ShardedEmbeddingTowerCollection
from torchrec.distributed.embeddingbag import ShardedEmbeddingBagCollection
from torchrec.distributed.model_parallel import (
    DefaultDataParallelWrapper,
    DistributedModelParallel,
)
from torchrec.distributed.types import ModuleSharder, ShardedModule, ShardingEnv, ShardingPlan
from torchrec.modules.embedding_tower import EmbeddingTowerCollection

from lightning_embark.baseline._dense_hooks import (
    Hook,
    check_dense_compression,
    dense_hook,
    dp_tables_hook,
    register_hook,
    tower_modules_hook,
)
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


def embedding_table_names(modules: Iterable[nn.Module]) -> list[str]:
    """The names of the tables held by ``modules`` (embedding collections, or tower
    collections' towers' collections): the keys torchrec's planner takes constraints by."""
    names = []
    for module in modules:
        for collection in _tables(module):
            configs = getattr(collection, "embedding_bag_configs", None) or getattr(
                collection, "embedding_configs", None
            )
            if configs is None:
                raise ConfigError(
                    f"{type(collection).__name__} is neither a torchrec EmbeddingBagCollection "
                    "nor an EmbeddingCollection: its tables cannot be named for the planner"
                )
            names += [config.name for config in configs()]
    return names


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


def release_node_groups() -> None:
    """Destroy the intra-host and cross-host process groups torchrec made for its
    table-row-wise, grid and tower shardings, and forget them (every rank, at the same
    point, once no torchrec-sharded module will run again).

    torchrec keeps them in module globals (``torchrec.distributed.comm._INTRA_PG`` and
    ``_CROSS_PG``), so ``destroy_process_group()`` alone leaves them alive, with their gloo
    threads and sockets, into the interpreter's exit: there the groups are freed in the
    teardown of modules while the peers exit and close their connections, and one rank in
    some dozens aborted there ("terminate called without an active exception", on a gloo
    thread). A later torchrec sharding in the same process makes them again.
    """
    from torchrec.distributed import comm

    for name in ("_INTRA_PG", "_CROSS_PG"):
        group = getattr(comm, name, None)
        if group is not None:
            with contextlib.suppress(ValueError):  # already destroyed with the default group
                dist.destroy_process_group(group)
            setattr(comm, name, None)


def shard_module(
    module: nn.Module,
    *,
    plan: ShardingPlan,
    sharders: list[ModuleSharder[nn.Module]],
    device: torch.device,
    pg: dist.ProcessGroup,
    static_graph: bool = True,
    find_unused_parameters: bool = False,
    dense_compression: str = "fp32",
    dense_register: Callable[[DistributedDataParallel], None] | None = None,
) -> DistributedModelParallel:
    """Wrap ``module`` in DMP: embedding collections sharded in place, DDP over the rest.

    The module object itself stays the one Lightning knows (DMP replaces its embedding
    children with sharded ones and allocates meta tensors on ``device``); only the
    wrapper is new. The dense DDP all-reduces in ``dense_compression``
    (:class:`HookedDataParallelWrapper`), or through ``dense_register``'s hook when given
    (the strategy's host-aware all-reduce).
    """
    return DistributedModelParallel(
        module,
        env=ShardingEnv.from_process_group(pg),
        device=device,
        plan=plan,
        sharders=sharders,
        init_data_parallel=True,
        data_parallel_wrapper=HookedDataParallelWrapper(
            dense_compression=dense_compression,
            dense_register=dense_register,
            static_graph=static_graph,
            find_unused_parameters=find_unused_parameters,
        ),
    )


class HookedDataParallelWrapper(DefaultDataParallelWrapper):
    """torchrec's DDP wrap of the dense part, then the communication hooks of every DDP.

    DMP calls :meth:`wrap` once, after sharding (when the data-parallel tables' and tower
    modules' DDP wrappers exist) and before any backward (hooks must be registered
    first). The dense DDP gets :func:`~._dense_hooks.dense_hook` of ``dense_compression``;
    the embedding side's DDP wrappers get fp32 hooks under their traffic labels (see
    :mod:`._dense_hooks`). torchrec's own ``allreduce_comm_precision="bf16"`` is not used:
    it registers the stock hook by a name DDP refuses without CUDA and NCCL.

    Args:
        dense_compression: The dense gradients' wire format, ``fp32``, ``bf16`` or ``fp16``.
        dense_register: Registers another hook on the dense DDP instead (None: the
            ``dense_compression`` one).
        **kwargs: ``DefaultDataParallelWrapper`` arguments (``static_graph``, ...).
    """

    def __init__(
        self,
        *,
        dense_compression: str = "fp32",
        dense_register: Callable[[DistributedDataParallel], None] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.dense_register = dense_register
        self.dense_compression = check_dense_compression(
            dense_compression, where="HookedDataParallelWrapper"
        )

    def wrap(self, dmp: DistributedModelParallel, env: ShardingEnv, device: torch.device) -> None:
        """DDP over the dense part (torchrec's), then a hook on every DDP under ``dmp``."""
        super().wrap(dmp, env, device)
        dense = dmp._dmp_wrapped_module
        if self.dense_register is not None and isinstance(dense, DistributedDataParallel):
            self.dense_register(dense)
        for ddp, hook in hooked_ddp_modules(dmp, self.dense_compression):
            register_hook(ddp, hook)


def hooked_ddp_modules(
    dmp: DistributedModelParallel, dense_compression: str
) -> list[tuple[DistributedDataParallel, Hook]]:
    """Every DDP wrapper under ``dmp`` that needs a hook, with its hook: the dense part's,
    data-parallel tables' lookups (kept by torchrec in the plain list ``_lookups``, out of
    ``.modules()``) and tower modules (under a sharded tower collection, which hides its
    children from ``named_modules()``); wrappers that already have a hook are left alone."""
    found: list[tuple[DistributedDataParallel, Hook]] = []
    dense = dmp._dmp_wrapped_module
    if isinstance(dense, DistributedDataParallel):
        found.append((dense, dense_hook(dense_compression)))
    stack: list[nn.Module] = [dmp]
    seen: set[int] = set()
    while stack:
        module = stack.pop()
        if id(module) in seen:
            continue
        seen.add(id(module))
        if isinstance(module, ShardedEmbeddingBagCollection):
            found += [(lookup, dp_tables_hook) for lookup in _ddp_in(module._lookups)]
        if isinstance(module, ShardedEmbeddingTowerCollection):
            found += [(m, tower_modules_hook) for m in _ddp_in(module.interactions.values())]
        stack.extend(child for child in module._modules.values() if child is not None)
    return [(ddp, hook) for ddp, hook in found if not ddp._comm_hooks]


def _ddp_in(modules: Iterable[object]) -> list[DistributedDataParallel]:
    return [m for m in modules if isinstance(m, DistributedDataParallel)]
