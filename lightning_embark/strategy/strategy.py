"""``strategy="embark"``: the EMBark engine under Lightning.

A thin :class:`~lightning.pytorch.strategies.DDPStrategy` subclass over the pure
functions of :mod:`.discovery`, :mod:`.planning` and :mod:`.sharding`. At setup it
finds the module's torchrec ``EmbeddingBagCollection`` s, obtains a plan (given, or
made on rank 0 and broadcast), checks it against the tables and the world size,
replaces each collection with the engine's ``ShardedEmbeddingBagCollection`` on a
process group of its own, and lets DDP wrap what is left: the dense parameters.

How dense and sparse stay apart: the engine's blocks are plain tensors, not
``nn.Parameter`` s, and are updated by the sparse optimizer inside the engine's
backward; so neither DDP nor ``configure_optimizers`` ever sees them (anything the
engine might register is also put on DDP's ignore list). The engine gets its own
process group because DDP all-reduces dense buckets asynchronously during backward
while the engine runs its backward exchanges; on one shared gloo group the two
streams of collectives could interleave differently on different ranks.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch.distributed as dist
from lightning.pytorch import Trainer
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.trainer.states import TrainerFn
from torch.nn.parallel import DistributedDataParallel
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from lightning_embark.baseline.planning import resolve_topology
from lightning_embark.engine.lookup import SparseOptimizer
from lightning_embark.engine.plan import Compression, Plan
from lightning_embark.engine.sharded import ShardedEmbeddingBagCollection
from lightning_embark.errors import ConfigError
from lightning_embark.models.optim import SparseOptimizerSpec
from lightning_embark.spec import ModelSpec
from lightning_embark.strategy.checkpoint import load_sharded, save_sharded
from lightning_embark.strategy.config import EmbarkOptions
from lightning_embark.strategy.dense_comm import (
    DenseAllReduceState,
    check_dense_options,
    default_dense_compression,
    dense_allreduce_state,
    hierarchical_allreduce_hook,
)
from lightning_embark.strategy.discovery import (
    find_embedding_collections,
    find_sparse_features,
    planned_name,
    sample_stats,
    spec_of,
    table_configs,
)
from lightning_embark.strategy.planning import (
    agree_on_plan,
    automatic_plan,
    plan_summary,
    torchrec_planner_plan,
    validate_plan,
)
from lightning_embark.strategy.sharding import (
    check_trainer_options,
    engine_optimizer,
    ignore_in_ddp,
    scale_embedding_grads,
    shard_collections,
    sync_initial_tables,
)
from lightning_embark.topology import Topology

log = logging.getLogger(__name__)


class EmbarkStrategy(DDPStrategy):
    """Lightning strategy sharding embeddings with EMBark's clusters (DP / RB / UB).

    Args:
        plan: A :class:`Plan` or a plan file; None: plan automatically at setup.
        topology: Our :class:`Topology` or a preset name, reshaped to the launch as
            ``strategy="torchrec"`` does (world size from ``torch.distributed``, ranks
            per host from ``EMBARK_RANKS_PER_HOST``, ``LOCAL_WORLD_SIZE`` or devices).
        allow: Compressions an automatic plan may use (default: lossless only).
        sparse_optimizer: Embedding optimizer; None: the module's ``sparse_optimizer_spec()``.
        kernel: Engine lookup kernel: ``"auto"``, ``"fbgemm"`` or ``"torch"``.
        unique_ratios: Measured distinct-ID ratios by table/feature for automatic planning.
        sample_statistics: Measure pooling factors and unique ratios on rank 0's first
            training batch when planning automatically.
        embedding_grad: ``"mean"`` (default; equals single-process training on the
            global batch) or ``"sum"`` (torchrec's convention); see :mod:`.sharding`.
        seed: Init seed for tables still on the ``meta`` device.
        planner: Automatic plans by ``"greedy"`` (default: the EMBark greedy planner) or
            ``"torchrec"`` (torchrec's planner's layout executed by this engine, to compare
            planners on one engine; fp32 only).
        dense_exchange: ``"hierarchical"`` (default): dense gradients are reduced inside
            each host, then one slice per local rank crosses hosts (see
            :mod:`.dense_comm`); ``"flat"``: DDP's own ring over every rank.
        dense_compression: Wire format of dense gradients: ``"fp32"`` (lossless),
            ``"bf16"`` or ``"fp16"``; None (default): ``"bf16"`` when ``allow`` names
            bf16 (the user accepts lossy formats on the wire), else ``"fp32"``.
        **kwargs: :class:`~lightning.pytorch.strategies.DDPStrategy` arguments.
    """

    strategy_name = "embark"
    #: Tells shardable modules to keep their tables on ``meta`` (see ShardableModule).
    shards_embeddings = True

    def __init__(
        self,
        *,
        plan: Plan | str | Path | None = None,
        topology: Topology | str | None = None,
        allow: Iterable[str | Compression] | str | None = None,
        sparse_optimizer: SparseOptimizerSpec | SparseOptimizer | None = None,
        kernel: str = "auto",
        unique_ratios: Mapping[str, float] | None = None,
        sample_statistics: bool = True,
        embedding_grad: str = "mean",
        seed: int = 0,
        planner: str = "greedy",
        dense_exchange: str = "hierarchical",
        dense_compression: str | Compression | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.dense_exchange = dense_exchange
        self.options = EmbarkOptions.create(
            plan=plan, topology=topology, allow=allow, sparse_optimizer=sparse_optimizer, kernel=kernel,
            unique_ratios=unique_ratios, sample_statistics=sample_statistics, embedding_grad=embedding_grad,
            seed=seed, planner=planner,
        )
        if dense_compression is None:
            dense_compression = default_dense_compression(self.options.allow)
        self.dense_compression = check_dense_options(dense_exchange, dense_compression)
        self._dense_state: DenseAllReduceState | None = None
        self.topology: Topology | None = None
        self._plan: Plan | None = self.options.plan
        self._sharded: dict[str, ShardedEmbeddingBagCollection] = {}
        self._sharded_module: Any = None
        self._embark_group: Any = None

    # --- reporting ---------------------------------------------------------------

    @property
    def plan(self) -> Plan | None:
        """The plan executed (None before setup unless one was given)."""
        return self._plan

    @property
    def sharded_modules(self) -> dict[str, ShardedEmbeddingBagCollection]:
        """Path in the LightningModule -> sharded collection (after setup)."""
        return dict(self._sharded)

    def plan_summary(self) -> str:
        """Per cluster and table: type, (r, k, c), compression and ranks."""
        if self._plan is None:
            return "no plan yet: the strategy plans during Trainer setup"
        return plan_summary(self._plan, self.topology)

    # --- setup -------------------------------------------------------------------

    @property
    def restore_checkpoint_after_setup(self) -> bool:
        """Restore after sharding: the unsharded tables are never allocated."""
        return True

    def setup(self, trainer: Trainer) -> None:
        """Check the trainer, shard the embeddings, then let DDP wrap the dense rest."""
        fitting = trainer.state.fn == TrainerFn.FITTING
        if fitting:
            check_trainer_options(
                precision=trainer.precision,
                gradient_clip_val=trainer.gradient_clip_val,
                accumulate_grad_batches=trainer.accumulate_grad_batches,
            )
        if self.root_device.type != "cpu":
            raise ConfigError(
                f"strategy='embark' runs its engine on CPU ranks (gloo) for now, not {self.root_device}; "
                "use Trainer(accelerator='cpu')"
            )
        self._shard(trainer, fitting=fitting)
        self._prepare_dense_allreduce()
        super().setup(trainer)

    def _prepare_dense_allreduce(self) -> None:
        """Build the dense-gradient hook's groups now, at the same point on every rank."""
        if self._dense_state is not None or not dist.is_initialized() or dist.get_world_size() == 1:
            return
        if self.dense_exchange == "flat" and self.dense_compression is Compression.FP32:
            return
        ranks_per_host = self.topology.ranks_per_host if self.dense_exchange == "hierarchical" else dist.get_world_size()
        self._dense_state = dense_allreduce_state(ranks_per_host=ranks_per_host, compression=self.dense_compression)

    def _register_ddp_hooks(self) -> None:
        """Install the dense all-reduce hook (Lightning's own registration is CUDA-only)."""
        if self._dense_state is not None and isinstance(self.model, DistributedDataParallel):
            self.model.register_comm_hook(self._dense_state, hierarchical_allreduce_hook)
            return
        super()._register_ddp_hooks()

    def _shard(self, trainer: Trainer, *, fitting: bool) -> None:
        module = self.lightning_module
        assert module is not None
        if self._sharded_module is not None:
            if self._sharded_module is not module:
                raise ConfigError(
                    "this EmbarkStrategy already sharded another LightningModule; create a new Trainer "
                    "(or strategy) for each model"
                )
            return
        collections = find_embedding_collections(module)
        configs = table_configs(collections)
        world = dist.get_world_size()
        self.topology = resolve_topology(
            self.options.topology, world_size=world, default_ranks_per_host=self.num_processes or None
        )
        if all(isinstance(c, ShardedEmbeddingBagCollection) for c in collections.values()):
            # Fitted before (by another Trainer): reuse its blocks and plan.
            self._plan = _merged_plan([c.plan for c in collections.values()])  # type: ignore[union-attr]
        elif self._plan is None:
            self._plan = agree_on_plan(lambda: self._automatic_plan(trainer, module, configs, fitting=fitting))
        validate_plan(self._plan, configs, world_size=world)
        if self._plan.ranks_per_host != self.topology.ranks_per_host:
            log.warning(
                "the plan assumes %d ranks per host but this launch has %d; hierarchical exchanges follow the plan",
                self._plan.ranks_per_host, self.topology.ranks_per_host,
            )
        self._embark_group = dist.new_group(ranks=list(range(world)), backend="gloo")
        sync_initial_tables(collections, self._embark_group)
        spec = self.options.sparse_optimizer
        if spec is None:
            get_spec = getattr(module, "sparse_optimizer_spec", None)
            spec = get_spec() if callable(get_spec) else SparseOptimizerSpec()
        fresh = {p: c for p, c in collections.items() if not isinstance(c, ShardedEmbeddingBagCollection)}
        self._sharded = shard_collections(
            module, collections, self._plan, optimizer=engine_optimizer(spec), group=self._embark_group,
            kernel=self.options.kernel, seed=self.options.seed,
        )
        if self.options.embedding_grad == "mean" and world > 1:
            scale_embedding_grads({p: self._sharded[p] for p in fresh}, 1.0 / world)
        ignore_in_ddp(module, self._sharded)
        self._sharded_module = module
        if self.global_rank == 0:
            log.info("embark plan:\n%s", self.plan_summary())

    def _automatic_plan(
        self, trainer: Trainer, module: Any, configs: list[EmbeddingBagConfig], *, fitting: bool
    ) -> Plan:
        """Rank 0's automatic plan (greedy, or torchrec's planner's) from measured (or spec) statistics."""
        assert self.topology is not None
        features = _first_sparse_batch(trainer) if fitting and self.options.sample_statistics else None
        stats = sample_stats(configs, features) if features is not None else {}
        reference = getattr(module, "spec", None)
        spec = spec_of(configs, stats=stats, reference=reference if isinstance(reference, ModelSpec) else None)
        ratios = {name: s.unique_ratio for name, s in stats.items() if s.unique_ratio}
        ratios |= _by_planned_name(self.options.unique_ratios or {}, configs)
        batch_size = features.stride() if features is not None else None
        if self.options.planner == "torchrec":
            return torchrec_planner_plan(spec, self.topology, batch_size=batch_size,
                                         compute_device=self.root_device.type)
        return automatic_plan(
            spec, self.topology, unique_ratios=ratios, allow=self.options.allow, batch_size=batch_size
        )

    # --- checkpoints -------------------------------------------------------------

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None) -> None:
        """Write a sharded checkpoint *directory* at ``filepath`` (see :mod:`.checkpoint`).

        Every rank writes the table rectangles it owns through ``torch.distributed.checkpoint``
        (each rank holds different blocks and sparse-optimizer state, which one file from
        rank 0 cannot hold); rank 0 adds Lightning's loops, callbacks and dense optimizers.
        Collective, like every Lightning checkpoint save: call it on every rank.
        """
        if storage_options is not None:
            raise ConfigError("strategy='embark' writes checkpoints itself; storage_options are not supported")
        path = Path(self.broadcast(str(filepath)))
        save_sharded(path, checkpoint, self._sharded, plan=self._plan)

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        """Read a checkpoint directory under the current plan, whatever plan wrote it.

        The embedding blocks and their optimizer state are loaded here; the returned
        dict's ``state_dict`` (dense) and ``optimizer_states`` follow Lightning's usual path.
        """
        path = Path(self.broadcast(str(checkpoint_path)))
        module = self.lightning_module
        assert module is not None
        return load_sharded(
            path, module, self._sharded, strict=module.strict_loading,
            load_meta=lambda meta: self.checkpoint_io.load_checkpoint(meta, weights_only=weights_only),
        )

    # --- teardown ----------------------------------------------------------------

    def teardown(self) -> None:
        """Unwrap DDP and release the plugins, leaving the module where it is.

        Lightning's default moves the module to the CPU; it already is there (the
        engine runs on CPU ranks), and a module whose setup was refused still has its
        tables on ``meta``, which cannot move, so the move would hide the refusal.
        """
        if isinstance(self.model, DistributedDataParallel):
            self.model = self.lightning_module
        assert self.cluster_environment is not None and self.accelerator is not None
        self.cluster_environment.teardown()
        self.precision_plugin.teardown()
        self.accelerator.teardown()
        self.checkpoint_io.teardown()


def _first_sparse_batch(trainer: Trainer) -> KeyedJaggedTensor | None:
    """The sparse features of the first training batch, or None when none is at hand.

    At strategy setup the fit loop has not loaded its dataloader yet, so this asks the
    trainer's data source (a private but stable Lightning attribute) for a fresh one;
    statistics are an optimisation, so any failure falls back to the spec's numbers.
    """
    source = getattr(trainer.fit_loop, "_data_source", None)
    try:
        if source is None or not source.is_defined():
            return None
        return find_sparse_features(next(iter(source.dataloader())))
    except Exception as error:  # noqa: BLE001 - best effort, logged
        log.warning("could not sample a training batch for plan statistics (%s); using the spec's", error)
        return None


def _by_planned_name(ratios: Mapping[str, float], configs: list[EmbeddingBagConfig]) -> dict[str, float]:
    """User ratios keyed by table (plan or torchrec name) or feature, re-keyed by plan name."""
    aliases = {}
    for config in configs:
        for alias in (config.name, planned_name(config), *config.feature_names):
            aliases[alias] = planned_name(config)
    unknown = sorted(set(ratios) - set(aliases))
    if unknown:
        raise ConfigError(f"unique_ratios names {unknown}, which are neither tables nor features of the module")
    return {aliases[name]: float(ratio) for name, ratio in ratios.items()}


def _merged_plan(plans: list[Plan]) -> Plan:
    """One plan covering several collections' (restricted) plans."""
    clusters = {c.name: c for plan in plans for c in plan.clusters}
    first = plans[0]
    return Plan(
        world_size=first.world_size, ranks_per_host=first.ranks_per_host,
        clusters=tuple(clusters.values()), tables=tuple(t for plan in plans for t in plan.tables),
    )
