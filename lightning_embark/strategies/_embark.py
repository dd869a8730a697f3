"""``strategy="embark"``: the EMBark engine under Lightning.

A thin shell over :func:`lightning_embark.sharding.shard_module`: at setup it checks
the trainer's options, shards the module's embedding collections (discover, plan,
agree, shard; see :mod:`lightning_embark.sharding._compose`), prints the plan on rank 0,
adds the per-step metrics callbacks and a model summary that counts the sharded tables
(:mod:`lightning_embark.sharding._callbacks`), installs the dense all-reduce hook, and
lets DDP wrap what is left: the dense parameters. Checkpoints are
sharded directories that load under any plan (:mod:`lightning_embark.sharding._checkpoint`).

How dense and sparse stay apart: the engine's blocks are plain tensors, not
``nn.Parameter`` s, and are updated by the sparse optimizer inside the engine's
backward; so neither DDP nor ``configure_optimizers`` ever sees them.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, ClassVar

from lightning.pytorch import Trainer
from lightning.pytorch.trainer.states import TrainerFn
from torch.nn.parallel import DistributedDataParallel
from typing_extensions import override

from lightning_embark.engine import EngineConfig, SparseOptimizer
from lightning_embark.errors import ConfigError
from lightning_embark.exchange import named_peer_failures
from lightning_embark.models import SparseOptimizerSpec
from lightning_embark.plan import Compression, Plan, TowerRequest, plan_summary
from lightning_embark.sharding import (
    DENSE_DDP_DEFAULTS,
    EmbarkOptions,
    EnginePlacement,
    ModuleSharding,
    PrefetchingLoader,
    engine_placement,
    export_sharded,
    hierarchical_allreduce_hook,
    load_sharded,
    prefetch_batch,
    release_sharded,
    save_sharded,
    shard_module,
    with_embark_callbacks,
)
from lightning_embark.strategies._base import ShardingStrategy
from lightning_embark.strategies._first_batch import first_sparse_batch
from lightning_embark.topology import Topology
from lightning_embark.torchrec_modules import ShardedEmbeddingBagCollection

log = logging.getLogger(__name__)


class EmbarkStrategy(ShardingStrategy):
    """Lightning strategy sharding embeddings with EMBark's clusters (DP / RB / UB).

    Args:
        plan: A :class:`~lightning_embark.plan.Plan` or a plan file; None: plan
            automatically at setup.
        topology: A :class:`~lightning_embark.topology.Topology` or a preset name,
            reshaped to the launch as ``strategy="torchrec"`` does (world size from
            ``torch.distributed``, ranks per host from ``EMBARK_RANKS_PER_HOST``,
            ``LOCAL_WORLD_SIZE`` or devices).
        allow: Compressions an automatic plan may use (default: lossless only).
        sparse_optimizer: Embedding optimizer; None: the module's ``sparse_optimizer_spec()``.
        store: The engine's embedding store: ``"auto"`` (fbgemm's table-batched kernels
            where they run, else torch), ``"fbgemm"`` or ``"torch"``.
        unique_ratios: Measured distinct-ID ratios by table/feature for automatic planning.
        sample_statistics: Measure pooling factors and unique ratios on rank 0's first
            training batch when planning automatically.
        embedding_grad: ``"mean"`` (default; equals single-process training on the
            global batch) or ``"sum"`` (torchrec's convention); see
            :mod:`lightning_embark.sharding._compose`.
        seed: Init seed for tables still on the ``meta`` device.
        planner: Automatic plans by ``"greedy"`` (default: the EMBark greedy planner) or
            ``"torchrec"`` (torchrec's planner's layout executed by this engine, to compare
            planners on one engine; fp32 only).
        dense_exchange: ``"hierarchical"`` (default): dense gradients are reduced inside
            each host, then one slice per local rank crosses hosts (see
            :mod:`lightning_embark.sharding._dense_allreduce`); ``"flat"``: DDP's own ring.
        dense_compression: Wire format of dense gradients: ``"fp32"`` (lossless),
            ``"bf16"`` or ``"fp16"``; None (default): ``"bf16"`` when ``allow`` names
            bf16 (the user accepts lossy formats on the wire), else ``"fp32"``.
        towers: DMT towers for the automatic plan: a count, ``"auto"`` (the planner
            decides: flat, or ``H``, ``2 H`` or ``L H`` towers, whichever its cost model
            prices cheapest, the comparison kept in ``plan.tower_choice``), a
            ``towers.json`` path or :class:`~lightning_embark.planner.TowerRequest` s;
            identity tower modules (the model is unchanged: each tower's tables live on one
            host, their IDs cross hosts once and their pooled vectors come back). None
            (default): a flat plan.
        pipeline: Distribute each training batch's IDs (RB and UB clusters: headers and
            IDs to their owners) while the step before it computes, over a process group
            of its own; bit-identical results (see :mod:`lightning_embark.sharding._prefetch`
            for what the model must do to benefit). On by default: measured 0.91x the step
            without it (T200, 2 x 2 emulated hosts, docs/benchmarks.md#the-input-pipelines).
        overlap: Issue each cluster's exchanges from a worker thread in plan order, so that
            one cluster's exchange overlaps the next cluster's lookups and encoding, and the
            backward's exchanges and updates run on past the step until the next lookup;
            bit-identical results. On by default: measured 0.88x (T200) and 0.83x (MLPerf,
            light dense part) the step without it (2 x 2 emulated hosts,
            docs/benchmarks.md#overlapping-clusters).
        metrics: Add :class:`~lightning_embark.accounting.CommAccountingCallback` and
            :class:`~lightning_embark.sharding.EmbarkMetricsCallback` to the trainer
            unless it has them (default True); False leaves the callbacks as passed.
        **kwargs: :class:`~lightning.pytorch.strategies.DDPStrategy` arguments; those it
            passes to ``DistributedDataParallel`` default as in torchrec's
            ``DistributedModelParallel`` (:data:`DENSE_DDP_DEFAULTS`).
    """

    strategy_name = "embark"
    #: Mixed bf16 runs the dense layers under autocast; the engine's tables, exchanges
    #: and optimizer stay fp32 (reduced-precision exchange is the plan's compression).
    supported_precisions: ClassVar[tuple[str, ...]] = ("32-true", "32", "bf16-mixed")
    precision_hint: ClassVar[str] = (
        "reduced-precision embedding exchange is chosen by the plan's compression, e.g. "
        "EmbarkStrategy(allow=['fp16'])"
    )

    def __init__(
        self,
        *,
        plan: Plan | str | Path | None = None,
        topology: Topology | str | None = None,
        allow: Iterable[str | Compression] | str | None = None,
        sparse_optimizer: SparseOptimizerSpec | SparseOptimizer | None = None,
        store: str = EngineConfig.store,
        unique_ratios: Mapping[str, float] | None = None,
        sample_statistics: bool = True,
        embedding_grad: str = "mean",
        seed: int = EngineConfig.seed,
        planner: str = "greedy",
        dense_exchange: str = "hierarchical",
        dense_compression: str | Compression | None = None,
        towers: int | str | Path | Iterable[TowerRequest] | None = None,
        pipeline: bool = EngineConfig.pipeline,
        overlap: bool = EngineConfig.overlap,
        metrics: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**{**DENSE_DDP_DEFAULTS, **kwargs})
        self.options = EmbarkOptions.create(
            plan=plan,
            topology=topology,
            allow=allow,
            sparse_optimizer=sparse_optimizer,
            store=store,
            unique_ratios=unique_ratios,
            sample_statistics=sample_statistics,
            embedding_grad=embedding_grad,
            seed=seed,
            planner=planner,
            dense_exchange=dense_exchange,
            dense_compression=dense_compression,
            towers=towers,
            pipeline=pipeline,
            overlap=overlap,
            metrics=metrics,
        )
        self._sharded: ModuleSharding | None = None
        self._sharded_module: Any = None
        self._released = False

    # --- reporting ---------------------------------------------------------------

    @property
    def plan(self) -> Plan | None:
        """The plan executed (None before setup unless one was given)."""
        return self._sharded.plan if self._sharded is not None else self.options.plan

    @property
    def sharded_modules(self) -> dict[str, ShardedEmbeddingBagCollection]:
        """Path in the LightningModule -> sharded collection (after setup)."""
        return dict(self._sharded.collections) if self._sharded is not None else {}

    @property
    def dense_exchange(self) -> str:
        """How dense gradients cross ranks: ``"hierarchical"`` or ``"flat"``."""
        return self.options.dense_exchange

    @property
    def dense_compression(self) -> Compression:
        """The dense gradients' wire format, as resolved from the options."""
        return self.options.dense_compression

    def format_plan(self, plan: Plan) -> str:
        return plan_summary(plan, self.topology)

    def placement(self) -> EnginePlacement:
        """The engine's device, process-group backend and store on this rank, from the
        trainer's device (:func:`~lightning_embark.sharding.engine_placement`): gloo on CPU,
        NCCL with one rank per GPU on CUDA.

        Raises:
            ConfigError: a device or backend the engine cannot run on, named.
        """
        return engine_placement(
            self.root_device,
            store=self.options.engine.store,
            process_group_backend=self._process_group_backend,
        )

    # --- setup -------------------------------------------------------------------

    @override
    def setup(self, trainer: Trainer) -> None:
        """Check the trainer, shard the embeddings, then let DDP wrap the dense rest."""
        self.check_fitting_trainer(trainer)
        fitting = trainer.state.fn == TrainerFn.FITTING
        placement = self.placement()
        module = self.lightning_module
        assert module is not None
        if self._released:
            raise ConfigError(
                "this EmbarkStrategy was released (release() destroyed its process groups); "
                "create a new strategy for another run"
            )
        if self._sharded_module is None:
            sample_batch = fitting and self.options.sample_statistics
            self._sharded = shard_module(
                module,
                self.options,
                default_ranks_per_host=self.num_processes or None,
                sample=(lambda: first_sparse_batch(trainer)) if sample_batch else (lambda: None),
                placement=placement,
            )
            self.topology = self._sharded.topology
            self._sharded_module = module
            self.announce_plan()
        elif self._sharded_module is not module:
            raise ConfigError(
                "this EmbarkStrategy already sharded another LightningModule; create a new "
                "Trainer (or strategy) for each model"
            )
        assert self.topology is not None
        # ``Trainer.callbacks`` is assigned by Lightning's callback connector, unannotated.
        callbacks = trainer.callbacks  # type: ignore[attr-defined]
        callbacks[:] = with_embark_callbacks(
            callbacks,
            metrics=self.options.metrics,
            ranks_per_host=self.topology.ranks_per_host,
        )
        super().setup(trainer)

    @override
    def process_dataloader(self, dataloader: object) -> object:
        """With ``pipeline=True``, the dataloader that starts each training batch's input
        distribution as Lightning's fetcher takes it (one step ahead of its lookup)."""
        if not self.options.engine.pipeline:
            return dataloader
        if not any(m.pipelined for m in self.sharded_modules.values()):
            if self.global_rank == 0:
                log.warning(
                    "pipeline=True but no sharded collection has an RB or UB cluster (DP tables "
                    "and towers have no input distribution to run ahead); training without it"
                )
            return dataloader
        module = self.lightning_module
        assert module is not None
        trainer = module.trainer
        return PrefetchingLoader(
            dataloader,
            lambda batch: prefetch_batch(batch, self.sharded_modules, self.root_device),
            active=lambda: trainer.training,
        )

    @override
    def _register_ddp_hooks(self) -> None:
        """Install the dense all-reduce hook (Lightning's own registration is CUDA-only)."""
        dense = self._sharded.dense if self._sharded is not None else None
        if dense is not None and isinstance(self.model, DistributedDataParallel):
            self.model.register_comm_hook(dense, hierarchical_allreduce_hook)
            return
        super()._register_ddp_hooks()

    @override
    def teardown(self) -> None:
        """Also stop the dense all-reduce thread and the engines' threads (the input
        pipeline's, the lane's; a later run of this strategy starts them again): a process
        training model after model must not keep them per run."""
        try:
            super().teardown()
        finally:  # no thread of this run may outlive it, whatever Lightning's part raised
            self._stop_threads(failing=sys.exc_info()[1] is not None)

    @override
    def settle(self) -> None:
        """Wait for every engine's last backward updates (they run past the step on the
        engine's lane), so a failure they met is raised here, before Lightning's
        collective, on every rank alike."""
        if self._sharded is not None:
            for module in self._sharded.collections.values():
                module.settle()

    def _stop_threads(self, *, failing: bool) -> None:
        """Stop the dense all-reduce thread and every engine's threads. After an error
        (``failing``) nothing in flight is waited for and what it raised is dropped: the
        error under way says more, and a rank waiting here for work stuck on a live peer
        would hold that peer too (it may wait for this rank in Lightning's barrier) until
        the groups' timeout; exiting closes this rank's sockets and frees it."""
        if self._sharded is None:
            return
        if self._sharded.dense is not None:
            self._sharded.dense.worker.close(wait=not failing)
        for module in self._sharded.collections.values():
            try:
                module.close(abandon=failing)  # else waits for the last backward's updates
            except Exception:
                if not failing:
                    raise

    def release(self) -> None:
        """Destroy the process groups this strategy's sharding built (every rank, at the
        same point, after its last ``fit``/``validate``); the strategy cannot run again.

        For a process that trains one model after another, as ``embark-tune``'s ranks
        do: gloo groups hold sockets to every peer, and a finished run's groups would
        otherwise stay until the process exits.
        """
        if self._sharded is not None and not self._released:
            release_sharded(self._sharded)
        self._released = True

    # --- checkpoints -------------------------------------------------------------

    @override
    def lightning_module_state_dict(self) -> dict[str, Any]:
        """The module's state, with every tower module first made current on every rank
        (a tower module trains on its host's ranks only; rank 0 saves the dense state)."""
        for module in self.sharded_modules.values():
            module.sync_tower_modules()
        return super().lightning_module_state_dict()

    @override
    def save_checkpoint(
        self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None
    ) -> None:
        """Write a sharded checkpoint *directory* at ``filepath`` (see
        :mod:`lightning_embark.sharding._checkpoint`).

        Every rank writes the table rectangles it owns through ``torch.distributed.checkpoint``
        (each rank holds different blocks and sparse-optimizer state, which one file from
        rank 0 cannot hold); rank 0 adds Lightning's loops, callbacks and dense optimizers.
        Collective, like every Lightning checkpoint save: call it on every rank.
        """
        if storage_options is not None:
            raise ConfigError(
                "strategy='embark' writes checkpoints itself; storage_options are not supported"
            )
        path = Path(self.broadcast(str(filepath)))
        with named_peer_failures(self.global_rank, "the checkpoint's save"):
            save_sharded(path, checkpoint, self.sharded_modules, plan=self.plan)

    def export(self, path: str | Path) -> None:
        """Write the trained model for serving: its full unsharded ``state_dict`` as one
        ``torch.save`` file at ``path`` (tables gathered to rank 0, the dense part included).

        Collective: call it on every rank after ``fit``. The file loads into the
        LightningModule as built, unsharded, with
        :func:`lightning_embark.sharding.load_exported` (see
        :mod:`lightning_embark.sharding._export`).
        """
        target = Path(self.broadcast(str(path)))
        export_sharded(target, self.lightning_module_state_dict(), self.sharded_modules)

    @override
    def load_checkpoint(
        self, checkpoint_path: Any, weights_only: bool | None = None
    ) -> dict[str, Any]:
        """Read a checkpoint directory under the current plan, whatever plan wrote it.

        The embedding blocks and their optimizer state are loaded here; the returned
        dict's ``state_dict`` (dense) and ``optimizer_states`` follow Lightning's usual path.
        """
        path = Path(self.broadcast(str(checkpoint_path)))
        module = self.lightning_module
        assert module is not None
        with named_peer_failures(self.global_rank, "the checkpoint's load"):
            return load_sharded(
                path,
                module,
                self.sharded_modules,
                strict=module.strict_loading,
                load_meta=lambda meta: self.checkpoint_io.load_checkpoint(
                    meta, weights_only=weights_only
                ),
            )
