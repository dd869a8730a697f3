"""``strategy="torchrec"``: torchrec's ``DistributedModelParallel`` under Lightning.

The baseline every figure is compared against. A thin shell over the pure functions
of :mod:`~lightning_embark.baseline` (torchrec planning, sharders, DMP): at setup it
resolves the topology, attaches the module's sparse optimizer to its embedding
weights, runs torchrec's planner collectively, and wraps the LightningModule in DMP,
which shards the embedding collections (fused TBE optimizer, updated in backward)
and DDP-wraps the dense remainder itself, all-reducing its gradients in the chosen wire
format (``dense_compression``, by DDP communication hooks). Lightning then drives DMP like
any wrapped model; the module's ``configure_optimizers`` sees only the weights that still
need a step.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, ClassVar

import torch.distributed as dist
from lightning.fabric.utilities.optimizer import _optimizers_to_device
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.trainer.states import TrainerFn
from torch import nn
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner.types import ParameterConstraints
from torchrec.distributed.types import ShardingPlan
from torchrec.optim.keyed import KeyedOptimizer
from typing_extensions import override

from lightning_embark.baseline import (
    BatchLoss,
    LookaheadLoader,
    apply_sparse_optimizer,
    as_shardable,
    check_constraints_within,
    check_dense_compression,
    check_qcomms_device,
    check_sharding_types,
    constraints_from_spec,
    embedding_table_names,
    force_sharding_types,
    lightning_module_under,
    make_sharders,
    make_train_pipeline,
    merge_constraints,
    plan_summary,
    plan_under_batch_loss,
    plan_with_torchrec,
    qcomms_config,
    release_node_groups,
    set_pipelined,
    shard_module,
    sync_local_world_size,
    to_torchrec_topology,
)
from lightning_embark.errors import ConfigError
from lightning_embark.plan import Compression
from lightning_embark.sharding import (
    DENSE_EXCHANGES,
    dense_allreduce_state,
    hierarchical_allreduce_hook,
    release_dense_state,
)
from lightning_embark.spec import ModelSpec
from lightning_embark.strategies._base import ShardingStrategy
from lightning_embark.topology import Topology, resolve_topology

_CHECKPOINT_HINT = (
    "checkpointing a torchrec-sharded model is not supported yet (each rank holds "
    "different embedding shards and fused optimizer state, which Lightning's single-file "
    "checkpoint cannot hold); pass enable_checkpointing=False to the Trainer"
)


class TorchrecStrategy(ShardingStrategy):
    """Lightning strategy sharding embeddings with torchrec's planner and DMP.

    Args:
        topology: Our :class:`Topology`, a preset name, or None. A preset (None:
            ``"emulated"``) is reshaped to the launch: world size from
            ``torch.distributed``, ranks per host from ``EMBARK_RANKS_PER_HOST``,
            ``LOCAL_WORLD_SIZE`` or Lightning's devices per node.
        qcomms: Pooled-embedding communication precision, forward and backward
            (``"fp16"``: torchrec's ``QCommsConfig(FP16, FP16)``); None for fp32.
        batch_size: Per-rank batch size for the planner's cost model (torchrec's
            default 512 when None).
        constraints: torchrec ``ParameterConstraints`` per table name; the module's
            spec supplies pooling factors for tables these leave at the default.
        sharding_types: torchrec sharding types every table is limited to (e.g.
            ``["table_row_wise"]``: ``strategy="torchrec-twrw"``, the baseline the EMBark
            paper reports against); None lets the planner choose per table.
        dense_compression: Wire format of the dense part's gradient all-reduce:
            ``"fp32"`` (DDP's own), ``"bf16"`` or ``"fp16"`` (torch's compression hooks:
            averaged, cast, all-reduced, cast back), the same choices as
            ``strategy="embark"``'s so that both can exchange the same dense bytes.
        dense_exchange: ``"flat"`` (DDP's one all-reduce over every rank, torchrec's own) or
            ``"hierarchical"`` (``strategy="embark"``'s host-aware all-reduce: reduced inside
            each host first), so that a comparison can give both strategies the same dense
            exchange and differ in the embedding exchange alone.
        plan: A ready ``ShardingPlan``; skips the planner.
        static_graph: DDP ``static_graph`` for the dense part (DMP's default: True).
        find_unused_parameters: DDP ``find_unused_parameters`` for the dense part.
        pipeline: Train through torchrec's ``TrainPipelineSparseDist``, which sends batch
            ``i + 1``'s KJT splits and IDs while batch ``i`` computes
            (:mod:`lightning_embark.baseline._pipeline`). The module then needs
            ``batch_loss(batch) -> (loss, output)`` (DLRMModule has) and one optimizer; the
            strategy switches it to manual optimisation, since the pipeline runs forward,
            backward and the optimizer step itself.
        **kwargs: :class:`~lightning.pytorch.strategies.DDPStrategy` arguments
            (``process_group_backend``, ``timeout``, ``start_method``, ...).
    """

    strategy_name = "torchrec"
    precision_hint: ClassVar[str] = "qcomms='fp16' for reduced-precision communication"

    def __init__(
        self,
        *,
        topology: Topology | str | None = None,
        qcomms: str | None = None,
        batch_size: int | None = None,
        constraints: dict[str, ParameterConstraints] | None = None,
        sharding_types: Sequence[str] | None = None,
        dense_compression: str = "fp32",
        dense_exchange: str = "flat",
        plan: ShardingPlan | None = None,
        static_graph: bool = True,
        find_unused_parameters: bool = False,
        pipeline: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if not isinstance(pipeline, bool):
            raise ConfigError(f"TorchrecStrategy pipeline must be True or False, got {pipeline!r}")
        self.pipeline = pipeline
        self._train_pipeline: Any = None
        self._feed: Iterator[Any] | None = None
        qcomms_config(qcomms)  # fail at construction on an unknown precision name
        self._dense_compression = check_dense_compression(
            dense_compression, where="TorchrecStrategy"
        )
        if dense_exchange not in DENSE_EXCHANGES:
            raise ConfigError(
                f"TorchrecStrategy dense_exchange={dense_exchange!r}; use one of "
                f"{list(DENSE_EXCHANGES)}"
            )
        self._dense_exchange = dense_exchange
        self._dense_state: Any = None
        if sharding_types is not None:
            sharding_types = check_sharding_types(sharding_types, where="TorchrecStrategy")
            if plan is not None:
                raise ConfigError(
                    f"TorchrecStrategy got both a plan and sharding_types={list(sharding_types)}; "
                    "a ready plan skips the planner the sharding types constrain: give one"
                )
            check_constraints_within(constraints, sharding_types, where="TorchrecStrategy")
        self.sharding_types: tuple[str, ...] | None = sharding_types
        if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
            raise ConfigError(
                f"TorchrecStrategy batch_size must be a positive integer, got {batch_size!r}"
            )
        if topology is not None and not isinstance(topology, (Topology, str)):
            raise ConfigError(
                "TorchrecStrategy topology must be a Topology, a preset name or None, got "
                f"{topology!r}"
            )
        self.qcomms = qcomms
        self.batch_size = batch_size
        self.constraints = dict(constraints) if constraints else None
        self._topology_arg = topology
        self._static_graph = static_graph
        self._find_unused_parameters = find_unused_parameters
        self._plan: ShardingPlan | None = plan
        self._dmp: DistributedModelParallel | None = None

    # --- reporting ---------------------------------------------------------------

    @property
    def plan(self) -> ShardingPlan | None:
        """The torchrec sharding plan (None before setup unless one was given)."""
        return self._plan

    @property
    def dense_compression(self) -> str:
        """The dense gradients' wire format: ``"fp32"``, ``"bf16"`` or ``"fp16"``."""
        return self._dense_compression

    @property
    def dense_exchange(self) -> str:
        """How dense gradients cross ranks: ``"flat"``, DDP's one all-reduce over every rank,
        or ``"hierarchical"``, reduced inside each host first."""
        return self._dense_exchange

    @property
    def fused_optimizer(self) -> KeyedOptimizer | None:
        """torchrec's fused embedding optimizer (after setup), e.g. to change its lr.

        Lightning's schedulers only see ``configure_optimizers``' dense optimizer.
        """
        return self._dmp.fused_optimizer if self._dmp is not None else None

    def format_plan(self, plan: ShardingPlan) -> str:
        """Per table: sharding type, compute kernel and ranks."""
        return plan_summary(plan, self.topology)

    # --- setup -------------------------------------------------------------------

    @override
    def setup(self, trainer: Trainer) -> None:
        """Shard the module with DMP and set up the optimizers it still needs."""
        assert self.accelerator is not None
        self.accelerator.setup(trainer)
        self.check_fitting_trainer(trainer)
        fitting = trainer.state.fn == TrainerFn.FITTING
        # ``Trainer.callbacks`` is assigned by Lightning's callback connector, unannotated.
        callbacks = trainer.callbacks  # type: ignore[attr-defined]
        if fitting and any(isinstance(cb, ModelCheckpoint) for cb in callbacks):
            raise ConfigError(_CHECKPOINT_HINT)
        check_qcomms_device(self.qcomms, self.root_device)
        if self._dmp is None:
            self._dmp = self._shard()
        elif lightning_module_under(self._dmp.module) is not self.lightning_module:
            raise ConfigError(
                "this TorchrecStrategy already sharded another LightningModule; "
                "create a new Trainer (or strategy) for each model"
            )
        self.model = self._dmp
        if fitting and self.pipeline:
            # torchrec's pipeline runs backward and the optimizer step (see training_step).
            assert self.lightning_module is not None
            self.lightning_module.automatic_optimization = False
        if fitting:
            self.setup_optimizers(trainer)
        self.setup_precision_plugin()
        if fitting:
            _optimizers_to_device(self.optimizers, self.root_device)

    def _shard(self) -> DistributedModelParallel:
        module = self.lightning_module
        assert module is not None
        shardable = as_shardable(module)
        pg = dist.GroupMember.WORLD
        assert pg is not None, "torch.distributed is initialized by setup_environment"
        self.topology = resolve_topology(
            self._topology_arg,
            world_size=dist.get_world_size(),
            default_ranks_per_host=self.num_processes or None,
        )
        target: nn.Module = BatchLoss(module) if self.pipeline else module
        sparse = shardable.sparse_optimizer_spec()
        apply_sparse_optimizer(shardable.embedding_modules().values(), sparse)
        device = self.root_device
        sharders = make_sharders(
            device=device, fused_params=sparse.fused_params(), qcomms=self.qcomms
        )
        if self._plan is None:
            spec = getattr(module, "spec", None)
            base = constraints_from_spec(spec) if isinstance(spec, ModelSpec) else {}
            constraints = merge_constraints(base, self.constraints)
            if self.sharding_types is not None:
                tables = embedding_table_names(shardable.embedding_modules().values())
                constraints = force_sharding_types(constraints, tables, self.sharding_types)
            self._plan = plan_with_torchrec(
                target,
                sharders,
                topology=to_torchrec_topology(self.topology, compute_device=device.type),
                batch_size=self.batch_size,
                constraints=constraints,
                pg=pg,
            )
        elif self.pipeline:
            self._plan = plan_under_batch_loss(self._plan)
        sync_local_world_size(self.topology.ranks_per_host)
        dmp = shard_module(
            target,
            plan=self._plan,
            sharders=sharders,
            device=device,
            pg=pg,
            static_graph=self._static_graph,
            find_unused_parameters=self._find_unused_parameters,
            dense_compression=self._dense_compression,
            dense_register=self._dense_register(),
        )
        self.announce_plan()
        return dmp

    def _dense_register(self) -> Any:
        """Registers the host-aware all-reduce on the dense DDP (``dense_exchange=
        "hierarchical"``, several ranks), its state built now on every rank; None: DDP's own
        ring with the ``dense_compression`` hook."""
        if self._dense_exchange != "hierarchical" or dist.get_world_size() == 1:
            return None
        topology = self.topology
        assert topology is not None  # resolved at setup, before the module is sharded
        self._dense_state = dense_allreduce_state(
            ranks_per_host=topology.ranks_per_host,
            compression=Compression(self._dense_compression),
        )
        state = self._dense_state

        def register(ddp: Any) -> None:
            ddp.register_comm_hook(state, hierarchical_allreduce_hook)

        return register

    @override
    def teardown(self) -> None:
        """Also stop the host-aware all-reduce's thread and groups, if it ran."""
        super().teardown()
        if self._dense_state is not None:
            release_dense_state(self._dense_state)
            self._dense_state = None

    # --- torchrec's train pipeline (pipeline=True) --------------------------------

    @override
    def process_dataloader(self, dataloader: object) -> object:
        """With ``pipeline=True``, the dataloader whose training passes also feed torchrec's
        pipeline (:class:`~lightning_embark.baseline._pipeline.LookaheadLoader`)."""
        if not self.pipeline:
            return dataloader
        module = self.lightning_module
        assert module is not None
        trainer = module.trainer

        def feed(batches: Iterator[Any]) -> None:
            if trainer.training:
                self._feed = batches

        return LookaheadLoader(dataloader, feed)

    @override
    def on_train_start(self) -> None:
        """Build torchrec's pipeline over DMP and Lightning's (only) optimizer."""
        super().on_train_start()
        if not self.pipeline:
            return
        assert self._dmp is not None
        self._train_pipeline = make_train_pipeline(
            self._dmp, self._lightning_optimizers, self.root_device
        )

    @override
    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        """With ``pipeline=True``, one step of torchrec's pipeline (forward, backward and
        optimizer step of the batch Lightning fetched, ``args[0]``), then the module's
        ``log_train_loss`` if it has one; its loss is returned for the callbacks."""
        if self._train_pipeline is None:
            return super().training_step(*args, **kwargs)
        assert self._feed is not None, "the training dataloader went through process_dataloader"
        assert self._dmp is not None
        set_pipelined(self._dmp, True)  # progress() re-attaches the pipeline after a validation
        loss, _ = self._train_pipeline.progress(self._feed)
        log = getattr(self.lightning_module, "log_train_loss", None)
        if callable(log) and args:
            log(loss, args[0])
        return loss

    @override
    def on_validation_start(self) -> None:
        """Give the sharded modules their own forwards back while Lightning validates
        (torchrec's pipeline keeps its batches in flight and re-attaches on its next step,
        :meth:`training_step`)."""
        super().on_validation_start()
        if self._train_pipeline is not None:
            assert self._dmp is not None
            self._train_pipeline.detach()
            set_pipelined(self._dmp, False)

    # --- checkpoints, teardown ---------------------------------------------------

    def release(self) -> None:
        """Destroy the intra-host and cross-host process groups torchrec made for this run's
        sharding (table-row-wise, grid, towers), which torchrec keeps for the whole process
        (see :func:`~lightning_embark.baseline.release_node_groups`); every rank, at the
        same point, after the last ``fit``/``validate``: the modules it sharded use them, so
        they cannot run again."""
        release_node_groups()

    @override
    def save_checkpoint(
        self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None
    ) -> None:
        """Not supported yet; raises with the fix (see :data:`_CHECKPOINT_HINT`)."""
        raise ConfigError(_CHECKPOINT_HINT)

    @override
    def load_checkpoint(
        self, checkpoint_path: Any, weights_only: bool | None = None
    ) -> dict[str, Any]:
        """Not supported yet; raises with the fix."""
        raise ConfigError(f"cannot resume from {checkpoint_path!s}: {_CHECKPOINT_HINT}")
