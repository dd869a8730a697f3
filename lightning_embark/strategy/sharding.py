"""Replacing a module's embedding collections with the engine's sharded ones.

Small pure steps the strategy calls in order: refuse trainer options an in-backward
embedding optimizer cannot honour, translate the module's sparse optimizer into the
engine's, make every rank start from the same tables, shard, and scale the embedding
gradients so that they mean what DDP's dense gradients mean.

Why the scaling: DDP *averages* dense gradients over ranks, so a data-parallel step
equals a single-process step on the global batch. The engine *sums* each row's
gradient over the ranks that read it (as torchrec does), which is ``world_size``
times that. With ``embedding_grad="mean"`` (the default) the gradient reaching the
sharded module is divided by the world size, so embark training on ``W`` ranks equals
single-process training on the ``W``-times-larger batch, for every sparse optimizer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from lightning_embark.engine.lookup import OptimizerKind, SparseOptimizer
from lightning_embark.engine.plan import Plan
from lightning_embark.engine.sharded import ShardedEmbeddingBagCollection
from lightning_embark.errors import ConfigError
from lightning_embark.models.optim import SparseOptimizerSpec
from lightning_embark.strategy.discovery import Collection, replace_submodule

#: Trainer precisions under which the strategy trains correctly. Mixed bf16 runs the
#: dense layers under autocast; the engine's tables, exchanges and optimizer stay fp32
#: (reduced-precision exchange is the plan's compression, not the trainer's precision).
SUPPORTED_PRECISIONS = ("32-true", "32", "bf16-mixed")

EMBEDDING_GRAD_MODES = ("mean", "sum")


def check_trainer_options(*, precision: str, gradient_clip_val: float | None, accumulate_grad_batches: int) -> None:
    """Refuse trainer options the engine's in-backward sparse optimizer cannot honour.

    Raises:
        ConfigError: gradient clipping (embedding gradients are applied inside
            backward and never materialised, so no norm can include them), gradient
            accumulation (the tables are updated by every backward, not every k-th),
            or a precision other than :data:`SUPPORTED_PRECISIONS` (``16-mixed``
            scales the loss, and the engine would apply the scaled gradients;
            ``*-true`` precisions would feed fp32 embeddings to low-precision layers).
    """
    if gradient_clip_val:
        raise ConfigError(
            f"gradient_clip_val={gradient_clip_val} is not supported with strategy='embark': the sparse "
            "optimizer updates the embedding tables inside backward, so their gradients never exist for a "
            "global norm; remove gradient_clip_val from the Trainer"
        )
    if accumulate_grad_batches != 1:
        raise ConfigError(
            f"accumulate_grad_batches={accumulate_grad_batches} is not supported with strategy='embark': the "
            "sparse optimizer updates the embedding tables in every backward; use 1 and a larger batch instead"
        )
    if str(precision) not in SUPPORTED_PRECISIONS:
        raise ConfigError(
            f"precision={precision!r} is not supported with strategy='embark'; use one of "
            f"{list(SUPPORTED_PRECISIONS)} (reduced-precision embedding exchange is chosen by the plan's "
            "compression, e.g. EmbarkStrategy(allow=['fp16']))"
        )


def engine_optimizer(spec: SparseOptimizerSpec | SparseOptimizer) -> SparseOptimizer:
    """The engine's sparse optimizer for the module's (or the user's) description."""
    if isinstance(spec, SparseOptimizer):
        return spec
    if isinstance(spec, SparseOptimizerSpec):
        # The engine needs eps > 0 (it guards 0/0); SGD ignores eps.
        return SparseOptimizer(kind=OptimizerKind(spec.kind), lr=spec.lr, eps=spec.eps or 1e-8)
    raise ConfigError(
        f"sparse_optimizer must be a SparseOptimizerSpec, an engine SparseOptimizer or None, got {spec!r}"
    )


def sync_initial_tables(collections: Mapping[str, Collection], group: Any) -> None:
    """Give every rank rank 0's allocated tables, as DDP does for dense weights.

    Each rank copies only its blocks out of its own full table, so tables that
    differ between ranks (seeded differently) would silently leave replicas and
    shards inconsistent. Tables still on ``meta`` need nothing: the engine seeds
    their init identically on every rank.
    """
    if dist.get_world_size(group) == 1:
        return
    for collection in collections.values():
        if isinstance(collection, ShardedEmbeddingBagCollection):
            continue
        for param in collection.parameters():
            if not param.is_meta:
                with torch.no_grad():
                    dist.broadcast(param.data, group_src=0, group=group)


def shard_collections(
    root: nn.Module,
    collections: Mapping[str, Collection],
    plan: Plan,
    *,
    optimizer: SparseOptimizer,
    group: Any,
    kernel: str,
    seed: int,
) -> dict[str, ShardedEmbeddingBagCollection]:
    """Replace each collection in ``root`` by a sharded one executing ``plan``.

    Already sharded collections are kept (a module fitted before). Every rank must
    call this with the same arguments: construction creates process groups.
    """
    sharded = {}
    for path, collection in collections.items():
        if isinstance(collection, ShardedEmbeddingBagCollection):
            sharded[path] = collection
            continue
        module = ShardedEmbeddingBagCollection.from_ebc(
            collection, plan, sparse_optimizer=optimizer, process_group=group, kernel=kernel, seed=seed
        )
        replace_submodule(root, path, module)
        sharded[path] = module
    return sharded


def scale_embedding_grads(modules: Mapping[str, nn.Module], scale: float) -> list[Any]:
    """Multiply the gradient reaching each module's output by ``scale``; returns the hook handles."""

    def hook(module: nn.Module, inputs: Any, output: Any) -> None:
        values = output.values()
        if values.requires_grad:
            values.register_hook(lambda grad: grad * scale)

    return [m.register_forward_hook(hook) for m in modules.values()]


def ignore_in_ddp(root: nn.Module, paths: Mapping[str, nn.Module]) -> None:
    """Keep any parameter or buffer of the sharded modules out of DDP.

    The engine holds its blocks as plain tensors (none today), but if a future
    version registers them, DDP must neither broadcast nor all-reduce them: each
    rank holds different blocks and updates them in backward.
    """
    names = [
        f"{path}.{name}"
        for path, module in paths.items()
        for name, _ in (*module.named_parameters(), *module.named_buffers())
    ]
    if names:
        previous = list(getattr(root, "_ddp_params_and_buffers_to_ignore", []))
        torch.nn.parallel.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(
            root, sorted(set(previous + names))
        )
