"""``EmbeddingEngine``: embedding tables executed by a sharding plan, without torchrec.

The engine's core takes the rank's *local* batch as jagged IDs per feature
(:class:`~lightning_embark.engine.FeatureBatch`: values, bag lengths, optional weights)
and returns the pooled vectors the unsharded tables would give for those samples,
``[B, sum(d)]`` in :attr:`EmbeddingEngine.output_keys` order. Tables live as blocks on
the ranks the plan names; each cluster of the plan runs one fused exchange per phase
(:mod:`lightning_embark.engine.clusters`). torchrec's types are the surface users see
(``lightning_embark.torchrec_modules``: ``ShardedEmbeddingBagCollection`` takes a
``KeyedJaggedTensor`` and returns a ``KeyedTensor``); the core imports neither torchrec
nor fbgemm, so it runs where they are not installed (a bare CUDA image).
The embedding rows are updated during backward by the sparse optimizer at their
owners (as torchrec's fused optimizers do); they are not ``nn.Parameter``s, so a
dense optimizer or DDP never sees them.

Input checks happen before any data is sent: an out-of-range ID raises a
:class:`ConfigError` naming the feature, table, ID and row count on the rank
that has it, and every other rank raises too (the first exchanging cluster's header
carries a status word), so nothing hangs and nothing is silently corrupted.

A peer that dies or stalls mid-exchange surfaces as a :class:`PeerError` naming this
rank, the cluster and the phase (the transport's own message is kept as the cause).

Device: the engine lives on one device, fixed at construction (``device=``; the CPU by
default). Blocks, optimizer state, tower modules and every buffer of a step are made
there, and so is everything the exchanges send (CPU tensors for gloo, CUDA tensors for
NCCL); batches must be there too. Only what Python needs (the counts that size
messages, ID ranges for the checks) comes to the host, once per use.

Non-finite values met while encoding an exchange follow the codec policy (NaN
sent as 0, inf saturated; see :mod:`lightning_embark.wire`): they are counted in
:attr:`EmbeddingEngine.nonfinite_count` and reported with a warning,
never raised mid-exchange (a rank leaving a collective would hang its peers). The counts
stay on the device: on the CPU the warning comes after the lookup or update that met
them; on CUDA, where reading them would make the host wait for the stream, when they are
read: :attr:`~EmbeddingEngine.nonfinite_count`, :meth:`~EmbeddingEngine.local_shards` (a
checkpoint) and :meth:`~EmbeddingEngine.close`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from lightning_embark._host_work import host_work
from lightning_embark.engine._batch import FeatureBatch
from lightning_embark.engine._checks import (
    checked_batch,
    destroyable,
    id_error,
    refuse_move,
    resolve_device,
)
from lightning_embark.engine._config import EngineConfig
from lightning_embark.engine._jagged import JaggedBatch
from lightning_embark.engine._local_shards import (
    LocalShard,
    full_tables_by_plan_name,
    initial_blocks,
    load_blocks,
    load_local_shards,
    local_shards,
)
from lightning_embark.engine._optimizer import SparseOptimizer
from lightning_embark.engine._parts import build_parts
from lightning_embark.engine._routing import TableInfo
from lightning_embark.engine._step import (
    Started,
    StepNode,
    forward_clusters,
    settle,
    start_backward,
)
from lightning_embark.engine._tables import TableConfig
from lightning_embark.errors import ConfigError
from lightning_embark.exchange import peer_failures, release_hierarchy_groups
from lightning_embark.plan import Plan


class EmbeddingEngine(nn.Module):
    """Embedding tables sharded by a :class:`Plan`, looked up through :meth:`lookup`.

    Args:
        tables: The tables (:class:`~lightning_embark.engine.TableConfig`), in model order.
        plan: The sharding plan; its ``world_size`` must be the group's size.
        sparse_optimizer: Optimizer applied to embedding rows during backward.
        is_weighted: Whether features carry per-sample weights (sum pooling only).
        process_group: The group the plan's ranks index (default group if None).
        weights: Full initial weights by plan or table name; every rank copies only its
            blocks. Missing tables get torchrec's uniform ``(-1/sqrt(rows),
            1/sqrt(rows))`` init, seeded per (table, row shard) so every replica and
            column shard of a row shard agrees (the seed is ``config.seed``).
        config: How the engine runs (:class:`~lightning_embark.engine.EngineConfig`: the
            store, the init seed, the input pipeline, the lane); None: the defaults, as
            ``EmbarkStrategy`` has them. With ``pipeline``, every rank of the group builds
            a second group for the input distribution here; with ``overlap``, the engine
            makes a group of its own (every rank of the group, here), which no other
            module's collectives share.
        tower_modules: Tower name -> module for the plan's towers that are not
            ``identity`` (:mod:`lightning_embark.engine._tower_modules` builds
            ``projection`` and ``dcn`` ones when absent; ``custom`` towers need theirs,
            on ``device``). Rank 0's parameters are broadcast to every rank at
            construction.
        device: Where the engine's blocks, optimizer state, tower modules and buffers
            live, and where :meth:`lookup` takes its batches (None: the CPU). The
            process group's backend must take tensors there (gloo: CPU, NCCL: CUDA).
            Fixed at construction: ``.to()`` (``.cuda()``, ``.cpu()``) to another device
            raises instead of moving the tower modules without the blocks.

    With towers in the plan, the output holds, in model order, the pooled vectors of
    every feature outside a non-identity tower, then one output per non-identity tower
    (key: the tower's name, width: its ``output_dim``), in plan order. With identity
    towers only, it is exactly the flat tables' output.
    """

    def __init__(
        self,
        tables: Sequence[TableConfig],
        plan: Plan,
        *,
        sparse_optimizer: SparseOptimizer,
        is_weighted: bool = False,
        process_group: Any = None,
        config: EngineConfig | None = None,
        weights: Mapping[str, torch.Tensor] | None = None,
        tower_modules: Mapping[str, nn.Module] | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        if config is None:
            config = EngineConfig()
        if not isinstance(config, EngineConfig):
            raise ConfigError(
                f"{type(self).__name__} config must be an EngineConfig, got {config!r}"
            )
        #: How the engine runs (store, seed, pipeline, overlap).
        self.config = config
        self._device = resolve_device(device)
        if not dist.is_initialized():
            raise ConfigError(
                f"{type(self).__name__} needs torch.distributed initialised (even for 1 rank)"
            )
        parts = build_parts(
            tables,
            plan,
            sparse_optimizer=sparse_optimizer,
            is_weighted=is_weighted,
            process_group=process_group,
            config=config,
            tower_modules=tower_modules,
            device=self._device,
            inner_engine=functools.partial(
                EmbeddingEngine,
                sparse_optimizer=sparse_optimizer,
                is_weighted=is_weighted,
                # The stage runs its inner module's collectives in its own order, on the
                # host's group, with the lane idle: no pipeline and no lane of its own.
                config=dataclasses.replace(config, pipeline=False, overlap=False),
                weights=weights,
                device=self._device,
            ),
        )
        self._configs = list(tables)
        self._tables, self._features, self._plan = parts.tables, parts.features, parts.plan
        self._is_weighted = is_weighted
        #: Groups this engine made for itself (destroyed by :meth:`release`).
        self._own_groups: list[Any] = parts.own_groups
        self._group = parts.group
        self._optimizer = sparse_optimizer
        self._rank = parts.rank
        self._clusters = parts.clusters
        self._ahead = parts.ahead
        self._lane = parts.lane
        #: The last backward's updates still running on the lane (see :meth:`settle`).
        self._unsettled: Started = []
        self._feature_dims = parts.feature_dims
        self.towers = nn.ModuleDict(parts.towers)
        self._stage = parts.stage
        self._keys = [key for key, _, _ in parts.outputs]
        self._dims = [width for _, width, _ in parts.outputs]
        self._layout = parts.layout
        # Each feature's table rows, for the ID range check.
        self._feature_rows = parts.feature_rows
        # The autograd node's tensor input (the batch has no float tensor to hang it on).
        self._anchor = torch.zeros((), requires_grad=True, device=self._device)
        self._reported_nonfinite = 0
        full = full_tables_by_plan_name(self._configs, self._tables, weights or {})
        for cluster, _ in self._clusters:
            load_blocks(cluster, initial_blocks(cluster, full, config.seed))
        # The inner module of the towers loaded its blocks when it was built.
        self._broadcast_initial_towers()

    def _apply(self, fn: Callable[..., Any], recurse: bool = True) -> Any:
        """``nn.Module``'s conversions (``to``, ``cuda``, ``cpu``...) keep the engine where it
        was built (:func:`~._checks.refuse_move`)."""
        refuse_move(fn, self._device)
        return super()._apply(fn, recurse)

    # ----------------------------------------------------------------- construction helpers
    def _broadcast_initial_towers(self) -> None:
        """Rank 0's tower-module parameters on every rank, as DDP does for dense weights
        (DDP ignores the sharded module's parameters)."""
        if dist.get_world_size(self._group) == 1:
            return
        with torch.no_grad():
            for tensor in (*self.towers.parameters(), *self.towers.buffers()):
                dist.broadcast(tensor.data, group_src=0, group=self._group)

    def sync_tower_modules(self) -> None:
        """Make every rank's tower modules current (collective; before saving a checkpoint).

        A tower module trains on its host's ranks only; elsewhere its copy keeps the values
        of the last sync.
        """
        self.settle()  # the broadcast shares the engine's group with the lane
        if self._stage is not None:
            self._stage.broadcast_modules()

    # ----------------------------------------------------------------- what it holds
    def embedding_configs(self) -> list[TableConfig]:
        """The tables as given, in model order."""
        return list(self._configs)

    @property
    def feature_names(self) -> list[str]:
        """Every feature :meth:`lookup` reads, in model order."""
        return [f.name for f in self._features]

    @property
    def output_keys(self) -> list[str]:
        """The output's column groups in order: feature names, then non-identity towers."""
        return list(self._keys)

    @property
    def output_dims(self) -> list[int]:
        """The width of each of :attr:`output_keys`."""
        return list(self._dims)

    def is_weighted(self) -> bool:
        """Whether features carry per-sample weights (torchrec's EBC API)."""
        return self._is_weighted

    @property
    def plan(self) -> Plan:
        return self._plan

    @property
    def nonfinite_count(self) -> int:
        """Non-finite values this rank's encoders met so far (sent as 0 / saturated); one
        host read of the device's counts."""
        inner = self._inner()
        return sum(c.nonfinite for c, _ in self._clusters) + (
            inner.nonfinite_count if inner is not None else 0
        )

    @property
    def table_infos(self) -> list[TableInfo]:
        """The tables as the engine sees them (plan name, shape, layout), in config order."""
        return list(self._tables)

    @property
    def sparse_optimizer(self) -> SparseOptimizer:
        """The optimizer applied to embedding rows (its kind fixes the optimizer-state shapes)."""
        return self._optimizer

    @property
    def device(self) -> torch.device:
        """Where the blocks, optimizer state and tower modules live and batches must be."""
        return self._device

    @property
    def pipelined(self) -> bool:
        """Whether :meth:`prefetch` runs input distributions ahead (``pipeline=True`` and
        the plan has an RB or UB cluster: DP tables and towers have none to run ahead)."""
        return self._ahead is not None

    @property
    def overlapped(self) -> bool:
        """Whether each cluster's exchanges run on the lane's worker thread (``overlap=True``),
        overlapping the next cluster's lookups."""
        return self._lane.overlap

    def close(self, *, abandon: bool = False) -> None:
        """Stop the engine's worker threads (the input pipeline's, the lane's) once their
        work is done (prefetched batches not yet looked up are dropped); a later step starts
        them again.

        For a process that trains one model after another (``embark-tune``'s ranks): a
        finished run keeps no thread.

        Args:
            abandon: After an error (the run is ending with it): drop the last backward's
                updates and leave whatever is in flight to the daemon threads instead of
                waiting for it. Work in flight may wait in a collective for a live peer
                that waits for this rank in another group; waiting for it here would hold
                both ranks until the group's timeout (see
                :meth:`~lightning_embark.engine._lane.Lane.close`).
        """
        if abandon:
            self._unsettled = []
        try:
            self.settle()  # may raise what the last backward met (a peer's failure)
        finally:  # the threads stop whatever it raised: none may outlive the run
            self._lane.close(wait=not abandon)
            if self._ahead is not None:
                self._ahead.pipeline.close(wait=not abandon)
            inner = self._inner()
            if inner is not None:
                inner.close(abandon=abandon)
        if not abandon:
            self._report_nonfinite(asked=True)

    def release(self) -> None:
        """:meth:`close`, then destroy the process groups this engine made for itself (its
        lane's, its input pipeline's, and the hierarchy groups made from them); every rank
        at the same point, once the engine will not run again. Groups of some ranks only
        are kept (see :func:`~lightning_embark.engine._checks.twin_group`)."""
        self.close()
        for group in self._own_groups:
            release_hierarchy_groups(group)
            if destroyable(group):
                dist.destroy_process_group(group)
        self._own_groups = []

    @property
    def pipeline_counts(self) -> tuple[int, int]:
        """Lookups that found their input distributed ahead, and lookups that did not."""
        if self._ahead is None:
            return 0, 0
        return self._ahead.pipeline.hits, self._ahead.pipeline.misses

    @property
    def process_group(self) -> Any:
        """The group the plan's ranks index (None: the default group)."""
        return self._group

    def local_shards(self) -> list[LocalShard]:
        """The blocks this rank holds, with their global rows, current weights and optimizer
        state (after the last backward's updates)."""
        self.settle()
        self._report_nonfinite(asked=True)
        inner = self._inner()
        return local_shards([c for c, _ in self._clusters]) + (
            inner.local_shards() if inner is not None else []
        )

    def _inner(self) -> EmbeddingEngine | None:
        """The module this rank runs for its host's towers, if any."""
        inner = self._stage.inner if self._stage is not None else None
        assert inner is None or isinstance(inner, EmbeddingEngine)  # built by tower_stage here
        return inner

    def load_local_shards(
        self, weights: Sequence[torch.Tensor], states: Sequence[torch.Tensor | None]
    ) -> None:
        """Overwrite every local block's weights and optimizer state, in
        :meth:`local_shards` order.

        A None state leaves that block's state as it is (e.g. a checkpoint saved with
        another sparse optimizer). Checkpoint loading calls it; forward/backward never do.
        """
        self.settle()
        flat = sum(len(c.local_blocks()) for c, _ in self._clusters)
        load_local_shards([c for c, _ in self._clusters], weights[:flat], states[:flat])
        inner = self._inner()
        if inner is not None:
            inner.load_local_shards(weights[flat:], states[flat:])

    # ----------------------------------------------------------------- forward / backward
    def lookup(self, features: Mapping[str, FeatureBatch]) -> torch.Tensor:
        """Pooled vectors ``[B, sum(output_dims)]`` of this rank's ``B`` samples.

        Collective: every rank of the group calls it once per step, with its own samples
        (``B`` may differ between ranks, and be 0).

        Args:
            features: Every feature of :attr:`feature_names` as jagged IDs of this rank's
                samples (one bag length per sample, IDs in ``0 .. rows - 1``), with IDs,
                lengths and weights on the engine's :attr:`device`.

        Raises:
            ConfigError: a feature is missing, a tensor is on another device, an ID is
                out of range, or weights are missing for a weighted engine; raised on
                every rank of the group (the exchanges carry the status), so no rank is
                left waiting.
        """
        size = next((b.batch_size for b in features.values()), 0)
        return self._lookup_batch(*self._checked(features, size, None), key=self._key(features))

    def prefetch(self, features: Mapping[str, FeatureBatch]) -> None:
        """Start distributing a batch that a later :meth:`lookup` of the same
        ``features`` (the same ID tensors) will look up: its checks, headers and IDs run on
        the pipeline's worker over the pipeline's group while this rank computes.

        Collective, like :meth:`lookup`: every rank prefetches its own batch, in the same
        order. An error in the batch (or a peer's) is raised by the lookup that takes it.

        Raises:
            ConfigError: the engine was not built with ``pipeline=True``, or its plan has
                no RB or UB cluster (nothing to run ahead).
        """
        size = next((b.batch_size for b in features.values()), 0)
        self._prefetch_batch(*self._checked(features, size, None), key=self._key(features))

    def _key(self, features: Mapping[str, FeatureBatch]) -> torch.Tensor | None:
        """What matches a lookup with its prefetch: the first feature's ID tensor."""
        first = features.get(self._features[0].name) if self._features else None
        return first.values if first is not None else None

    def _prefetch_batch(
        self, batch: JaggedBatch, error: ConfigError | None, *, key: torch.Tensor | None
    ) -> None:
        """:meth:`prefetch` of a batch in feature order (see :meth:`_checked`)."""
        if self._ahead is None:
            raise ConfigError(
                "prefetch() needs an engine built with pipeline=True whose plan has an RB or "
                "UB cluster (DP tables and towers distribute no IDs); build it so, or call "
                "lookup() alone"
            )
        if key is None:
            raise ConfigError("prefetch() got no feature of this engine; nothing to distribute")
        self._ahead.submit(key, batch, error, self._id_error)

    def _checked(
        self, features: Mapping[str, FeatureBatch], size: int, error: ConfigError | None
    ) -> tuple[JaggedBatch, ConfigError | None]:
        """:func:`~._checks.checked_batch` for this engine's features."""
        return checked_batch(
            features, self._features, size, error, weighted=self._is_weighted, device=self._device
        )

    def _id_error(self, batch: JaggedBatch) -> ConfigError | None:
        """:func:`~._checks.id_error` for this engine's features and tables."""
        return id_error(
            batch, self._features, self._tables, self._feature_rows, device=self._device
        )

    def _lookup_batch(
        self,
        batch: JaggedBatch,
        error: ConfigError | None,
        *,
        key: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """:meth:`lookup` of a batch in feature order, once the caller's checks gave
        ``error`` (None: the IDs are checked here, unless :meth:`prefetch` checked and
        distributed them ahead under ``key``)."""
        prepared = self._ahead.take(key) if self._ahead is not None else None
        if error is None and prepared is None:
            error = self._id_error(batch)
        if torch.is_grad_enabled():

            def step() -> tuple[torch.Tensor, Callable[[torch.Tensor], None]]:
                values, states = self._run_forward(batch, error, keep=True, prepared=prepared)
                return values, lambda grad: self._run_backward(states, grad)

            values = StepNode.apply(step, self._anchor)
        else:
            values, _ = self._run_forward(batch, error, keep=False, prepared=prepared)
        self._report_nonfinite()
        return values

    def _run_forward(
        self,
        batch: JaggedBatch,
        error: ConfigError | None,
        *,
        keep: bool,
        prepared: dict[int, Any] | None = None,
    ) -> tuple[torch.Tensor, list[Any]]:
        self.settle()  # the last backward's updates, before the lookups read the blocks
        exchanging = self._stage is not None or any(c.exchanges for c, _ in self._clusters)
        if error is not None and not exchanging:
            raise error
        pooled, states = forward_clusters(
            self._clusters,
            batch,
            error=error,
            keep=keep,
            lane=self._lane,
            prepared=prepared or {},
            rank=self._rank,
        )
        towers = torch.zeros(batch.batch_size, 0, device=self._device)
        if self._stage is not None:
            with peer_failures(self._rank, "towers", "forward"):
                towers, tower_state = self._stage.forward(batch.features(), keep=keep, error=error)
            states.append(tower_state)
        return self._layout.assemble(pooled, towers), states

    def _run_backward(self, states: list[Any], grad: torch.Tensor) -> None:
        """The step's backward: the towers' (whose collectives share the engine's group, so
        they go first, with the lane idle), then every cluster's, left running on the lane
        when it overlaps (settled by :meth:`settle` before the blocks are used again)."""
        grads, tower_grad = self._layout.split_grad(grad)
        if self._stage is not None:
            with peer_failures(self._rank, "towers", "backward"):
                self._stage.backward(states[-1], tower_grad)
        self._unsettled = start_backward(
            self._clusters,
            states[: len(self._clusters)],
            grads,
            lane=self._lane,
            rank=self._rank,
        )
        if not self._lane.overlap:
            self.settle()

    def settle(self) -> None:
        """Wait for the last backward's updates (before a lookup reads the blocks, a
        checkpoint copies them, or a collective runs on the engine's group or between
        steps), then report what its encoders met.

        Raises:
            PeerError: the updates met a dead or failed peer.
        """
        unsettled, self._unsettled = self._unsettled, []
        settle(unsettled, lane=self._lane, rank=self._rank)
        self._report_nonfinite()

    def _report_nonfinite(self, *, asked: bool = False) -> None:
        """Warn about the non-finite values encoded since the last warning: on the CPU
        whenever called (reading the counts there is host work), elsewhere only when
        ``asked`` (reading them makes the host wait for the stream)."""
        on_cpu = self._device.type == "cpu"
        if not (on_cpu or asked):
            return
        with host_work() if on_cpu else contextlib.nullcontext():
            count = self.nonfinite_count
        if count > self._reported_nonfinite:
            warnings.warn(
                f"rank {self._rank}: {count - self._reported_nonfinite} non-finite embedding "
                "values were encoded for exchange (NaN sent as 0, inf saturated; see "
                "lightning_embark.wire)",
                RuntimeWarning,
                stacklevel=3,
            )
            self._reported_nonfinite = count
