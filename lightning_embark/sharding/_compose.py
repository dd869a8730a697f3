"""Sharding a LightningModule's embeddings with the engine: the steps, in one order.

:func:`shard_module` is the whole of what ``strategy="embark"`` does to a module
before DDP wraps the dense rest, as one pure function of the module, the options and
the launch (testable on gloo ranks without a Trainer):

1. **discover** the module's torchrec ``EmbeddingBagCollection`` s and their tables;
2. **plan**: the given plan, or the automatic one (greedy or torchrec's planner) from
   the statistics of a sample batch, made on rank 0;
3. **agree**: rank 0's plan is broadcast, and checked against the tables on every rank;
4. **shard**: every rank starts from rank 0's tables and replaces each collection by
   a :class:`~lightning_embark.torchrec_modules.ShardedEmbeddingBagCollection` on a process
   group of the engine's own (gloo on CPU, NCCL on GPUs: ``engine._placement``);
5. **leave the dense rest to DDP**: embedding gradients are scaled to mean what DDP's
   dense gradients mean, anything the engine registers is put on DDP's ignore list,
   and the dense all-reduce's process groups are built (every rank, same point).

Why the scaling: DDP *averages* dense gradients over ranks, so a data-parallel step
equals a single-process step on the global batch. The engine *sums* each row's
gradient over the ranks that read it (as torchrec does), which is ``world_size``
times that. With ``embedding_grad="mean"`` (the default) the gradient reaching the
sharded module is divided by the world size, so embark training on ``W`` ranks equals
single-process training on the ``W``-times-larger batch, for every sparse optimizer.

Why a process group of the engine's own: DDP all-reduces dense buckets asynchronously
during backward while the engine runs its backward exchanges; on one shared gloo
group the two streams of collectives could interleave differently on different ranks.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_tower import EmbeddingTowerCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from lightning_embark.engine import (
    EngineConfig,
    EnginePlacement,
    OptimizerKind,
    SparseOptimizer,
    engine_placement,
)
from lightning_embark.errors import ConfigError
from lightning_embark.exchange import release_hierarchy_groups, start_liveness
from lightning_embark.models import SparseOptimizerSpec
from lightning_embark.plan import Compression, Plan, names
from lightning_embark.sharding._dense_allreduce import (
    DenseAllReduceState,
    dense_allreduce_state,
    release_dense_state,
)
from lightning_embark.sharding._discovery import (
    Collection,
    find_embedding_collections,
    replace_submodule,
    sample_stats,
    spec_of,
    table_configs,
)
from lightning_embark.sharding._options import EmbarkOptions
from lightning_embark.sharding._planning import (
    agree_on_plan,
    automatic_plan,
    planned_sparse_optimizer,
    torchrec_planner_plan,
    validate_plan,
)
from lightning_embark.sharding._towers import check_tower_modules, planned_towers
from lightning_embark.spec import ModelSpec
from lightning_embark.topology import Topology, resolve_topology
from lightning_embark.torchrec_modules import (
    ShardedEmbeddingBagCollection,
    ShardedEmbeddingTowerCollection,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class ModuleSharding:
    """What :func:`shard_module` made of a module.

    Attributes:
        plan: The plan every rank executes.
        topology: The launch's topology (the plan's shape may differ; see the log).
        collections: Path in the module -> its sharded collection.
        group: The engine's process group.
        dense: The dense all-reduce hook's state, or None for DDP's own all-reduce.
    """

    plan: Plan
    topology: Topology
    collections: dict[str, ShardedEmbeddingBagCollection]
    group: Any
    dense: DenseAllReduceState | None


def shard_module(
    module: nn.Module,
    options: EmbarkOptions,
    *,
    default_ranks_per_host: int | None = None,
    sample: Callable[[], KeyedJaggedTensor | None] = lambda: None,
    placement: EnginePlacement | None = None,
) -> ModuleSharding:
    """Shard ``module``'s embedding collections in place (see the module docstring).

    Every rank of the default process group calls it with the same arguments:
    sharding builds process groups, and the plan is agreed by broadcast.

    Args:
        module: The LightningModule (or any module holding torchrec collections).
        options: The strategy's options.
        default_ranks_per_host: Ranks per host when the environment does not say
            (Lightning's devices per node).
        sample: Rank 0's sample batch for the automatic plan's statistics (called
            on rank 0 only, when planning automatically); None: the spec's numbers.
        placement: The engine's device, backend and store on this rank
            (:func:`~lightning_embark.engine.engine_placement`); None: CPU
            over gloo with ``options.engine.store``.

    Raises:
        ConfigError: no collection, a bad plan, planning failed (on every rank).
    """
    if placement is None:
        placement = engine_placement(torch.device("cpu"), store=options.engine.store)
    collections = find_embedding_collections(module)
    configs = table_configs(collections)
    world = dist.get_world_size()
    topology = resolve_topology(
        options.topology, world_size=world, default_ranks_per_host=default_ranks_per_host
    )
    if all(isinstance(c, ShardedEmbeddingBagCollection) for c in collections.values()):
        # Fitted before (by another Trainer): reuse its blocks and plan.
        plan = _merged_plan([c.plan for c in collections.values()])
    elif options.plan is not None:
        plan = options.plan
    else:
        plan = agree_on_plan(
            lambda: _automatic_plan(
                module, collections, topology, options, sample(), placement.device.type
            )
        )
    validate_plan(plan, configs, world_size=world)
    check_tower_modules(plan, collections)
    if plan.ranks_per_host != topology.ranks_per_host:
        log.warning(
            "the plan assumes %d ranks per host but this launch has %d; hierarchical exchanges "
            "follow the plan",
            plan.ranks_per_host,
            topology.ranks_per_host,
        )
    # Every rank's liveness socket, so that a peer's death is reported with its rank.
    start_liveness(topology.ranks_per_host)
    group = dist.new_group(ranks=list(range(world)), backend=placement.backend)
    sync_initial_tables(collections, group, placement.device)
    spec = options.sparse_optimizer
    if spec is None:
        get_spec = getattr(module, "sparse_optimizer_spec", None)
        spec = get_spec() if callable(get_spec) else SparseOptimizerSpec()
    fresh = [p for p, c in collections.items() if not isinstance(c, ShardedEmbeddingBagCollection)]
    sharded = shard_collections(
        module,
        collections,
        plan,
        optimizer=engine_optimizer(spec),
        group=group,
        config=dataclasses.replace(options.engine, store=placement.store),
        device=placement.device,
    )
    if options.embedding_grad == "mean" and world > 1:
        scale_embedding_grads({p: sharded[p] for p in fresh}, 1.0 / world)
    ignore_in_ddp(module, sharded)
    return ModuleSharding(
        plan=plan,
        topology=topology,
        collections=sharded,
        group=group,
        dense=_dense_state(options, topology),
    )


def _automatic_plan(
    module: nn.Module,
    collections: Mapping[str, Collection],
    topology: Topology,
    options: EmbarkOptions,
    features: KeyedJaggedTensor | None,
    compute_device: str,
) -> Plan:
    """Rank 0's automatic plan (greedy, or torchrec's planner's) from measured (or spec)
    statistics; torchrec tower collections plan one tower per ``EmbeddingTower``."""
    configs = table_configs(collections)
    stats = sample_stats(configs, features) if features is not None else {}
    reference = getattr(module, "spec", None)
    spec = spec_of(
        configs, stats=stats, reference=reference if isinstance(reference, ModelSpec) else None
    )
    ratios = {name: s.unique_ratio for name, s in stats.items() if s.unique_ratio}
    ratios |= _by_plan_name(options.unique_ratios or {}, configs)
    batch_size = features.stride() if features is not None else None
    if options.planner == "torchrec":
        return torchrec_planner_plan(
            spec, topology, batch_size=batch_size, compute_device=compute_device
        )
    return automatic_plan(
        spec,
        topology,
        unique_ratios=ratios,
        allow=options.allow,
        batch_size=batch_size,
        towers=planned_towers(collections, options.towers),
        sparse_optimizer=planned_sparse_optimizer(module, options.sparse_optimizer),
        compute_device=compute_device,
    )


def _by_plan_name(
    ratios: Mapping[str, float], configs: list[EmbeddingBagConfig]
) -> dict[str, float]:
    """User ratios keyed by table (plan or torchrec name) or feature, re-keyed by plan name."""
    aliases = {}
    for config in configs:
        for alias in (*names.aliases(config), *config.feature_names):
            aliases[alias] = names.plan_name(config)
    unknown = sorted(set(ratios) - set(aliases))
    if unknown:
        raise ConfigError(
            f"unique_ratios names {unknown}, which are neither tables nor features of the module"
        )
    return {aliases[name]: float(ratio) for name, ratio in ratios.items()}


def _merged_plan(plans: list[Plan]) -> Plan:
    """One plan covering several collections' (restricted) plans."""
    clusters = {c.name: c for plan in plans for c in plan.clusters}
    first = plans[0]
    return Plan(
        world_size=first.world_size,
        ranks_per_host=first.ranks_per_host,
        clusters=tuple(clusters.values()),
        tables=tuple(t for plan in plans for t in plan.tables),
        towers=tuple(t for plan in plans for t in plan.towers),
    )


def release_sharded(sharded: ModuleSharding) -> None:
    """Destroy the process groups :func:`shard_module` built and stop the dense thread.

    Every rank calls it at the same point, once the sharded module will not run again.
    A process that shards one model after another (``embark-tune``'s ranks) would
    otherwise keep every earlier model's gloo groups, about 30 sockets per run on
    2 x 2 ranks, and their buffers.
    """
    if sharded.dense is not None:
        release_dense_state(sharded.dense)
    for module in sharded.collections.values():
        module.release()  # the groups of its lane and input pipeline
    release_hierarchy_groups(sharded.group)
    dist.destroy_process_group(sharded.group)


def _dense_state(options: EmbarkOptions, topology: Topology) -> DenseAllReduceState | None:
    """The dense-gradient hook's state, built now at the same point on every rank; None
    where DDP's own fp32 ring is what the options ask for (or there is one rank)."""
    world = dist.get_world_size()
    if world == 1 or (
        options.dense_exchange == "flat" and options.dense_compression is Compression.FP32
    ):
        return None
    ranks_per_host = topology.ranks_per_host if options.dense_exchange == "hierarchical" else world
    return dense_allreduce_state(
        ranks_per_host=ranks_per_host, compression=options.dense_compression
    )


def engine_optimizer(spec: SparseOptimizerSpec | SparseOptimizer) -> SparseOptimizer:
    """The engine's sparse optimizer for the module's (or the user's) description."""
    if isinstance(spec, SparseOptimizer):
        return spec
    if isinstance(spec, SparseOptimizerSpec):
        # The engine needs eps > 0 (it guards 0/0); SGD ignores eps.
        return SparseOptimizer(kind=OptimizerKind(spec.kind), lr=spec.lr, eps=spec.eps or 1e-8)
    raise ConfigError(
        "sparse_optimizer must be a SparseOptimizerSpec, an engine SparseOptimizer or None, got "
        f"{spec!r}"
    )


def sync_initial_tables(
    collections: Mapping[str, Collection], group: Any, device: torch.device | None = None
) -> None:
    """Give every rank rank 0's allocated tables, as DDP does for dense weights.

    Each rank copies only its blocks out of its own full table, so tables that
    differ between ranks (seeded differently) would silently leave replicas and
    shards inconsistent. Tables still on ``meta`` need nothing: the engine seeds
    their init identically on every rank. A table travels through ``device`` (the
    engine group's: NCCL broadcasts CUDA tensors only) and stays where it was.
    """
    if dist.get_world_size(group) == 1:
        return
    for collection in collections.values():
        if isinstance(collection, ShardedEmbeddingBagCollection):
            continue
        for param in collection.parameters():
            if not param.is_meta:
                with torch.no_grad():
                    wire = param.data if device is None else param.data.to(device)
                    dist.broadcast(wire, group_src=0, group=group)
                    if wire is not param.data:
                        param.data.copy_(wire)


def shard_collections(
    root: nn.Module,
    collections: Mapping[str, Collection],
    plan: Plan,
    *,
    optimizer: SparseOptimizer,
    group: Any,
    config: EngineConfig,
    device: torch.device | None = None,
) -> dict[str, ShardedEmbeddingBagCollection]:
    """Replace each collection in ``root`` by a sharded one executing ``plan`` on
    ``device`` (None: the CPU), each engine run as ``config`` says.

    Already sharded collections are kept (a module fitted before). Every rank must
    call this with the same arguments: construction creates process groups.
    """
    sharded = {}
    for path, collection in collections.items():
        if isinstance(collection, ShardedEmbeddingBagCollection):
            sharded[path] = collection
            continue
        module: ShardedEmbeddingBagCollection
        if isinstance(collection, EmbeddingTowerCollection):
            module = ShardedEmbeddingTowerCollection.from_etc(
                collection,
                plan,
                sparse_optimizer=optimizer,
                process_group=group,
                config=config,
                device=device,
            )
        else:
            module = ShardedEmbeddingBagCollection.from_ebc(
                collection,
                plan,
                sparse_optimizer=optimizer,
                process_group=group,
                config=config,
                device=device,
            )
        replace_submodule(root, path, module)
        sharded[path] = module
    return sharded


def scale_embedding_grads(modules: Mapping[str, nn.Module], scale: float) -> list[Any]:
    """Multiply the gradient reaching each module's output by ``scale``; returns the hook
    handles."""

    def hook(module: nn.Module, inputs: Any, output: Any) -> None:
        values = output if isinstance(output, torch.Tensor) else output.values()
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
