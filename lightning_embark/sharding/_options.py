"""The options of :class:`~lightning_embark.strategies.EmbarkStrategy`, validated on construction.

A typo in a strategy option should fail when the Trainer is built, on every rank,
not minutes later inside setup on some ranks; so the strategy keeps its options in
this frozen dataclass and checks them in ``__post_init__`` (a plan file is read here
too, for the same reason).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightning_embark.engine import EngineConfig, SparseOptimizer
from lightning_embark.errors import ConfigError
from lightning_embark.models import SparseOptimizerSpec
from lightning_embark.plan import Compression, Plan, TowerModule, TowerRequest, load_towers
from lightning_embark.sharding._dense_allreduce import (
    check_dense_options,
    default_dense_compression,
)
from lightning_embark.sharding._planning import check_allow, load_plan
from lightning_embark.topology import Topology

#: Who makes the automatic plan (see ``EmbarkOptions.planner``).
PLANNERS = ("greedy", "torchrec")
#: How embedding gradients are combined over ranks (see :mod:`.compose`).
EMBEDDING_GRAD_MODES = ("mean", "sum")


@dataclass(frozen=True, kw_only=True)
class EmbarkOptions:
    """What the strategy shards with, and whether it logs per-step metrics.

    Attributes:
        plan: A plan or plan file; None plans automatically at setup.
        topology: A :class:`Topology` or preset name for automatic planning (None:
            the ``emulated`` preset reshaped to the launch, as ``strategy="torchrec"``).
        allow: Compressions an automatic plan may use (default: fp32 only, lossless).
        sparse_optimizer: The embedding optimizer; None: the module's
            ``sparse_optimizer_spec()`` (row-wise Adagrad when it has none).
        unique_ratios: Distinct IDs / IDs per per-rank batch, by table or feature
            name, for automatic planning; overrides what a sample batch shows.
        sample_statistics: Measure pooling factors and unique ratios on rank 0's first
            training batch when planning automatically.
        embedding_grad: ``"mean"`` (embedding gradients averaged over ranks, like
            DDP's dense ones: equals single-process training on the global batch) or
            ``"sum"`` (torchrec's convention).
        planner: Who makes the automatic plan: ``"greedy"`` (the EMBark greedy
            planner) or ``"torchrec"`` (torchrec's ``EmbeddingShardingPlanner`` on the
            same topology, its plan imported as fp32 RB/DP clusters): the engine then
            runs torchrec's layout, so planners can be compared on one engine.
        dense_exchange: ``"hierarchical"``: dense gradients are reduced inside each
            host, then one slice per local rank crosses hosts
            (:mod:`~lightning_embark.sharding._dense_allreduce`); ``"flat"``: DDP's own
            ring over every rank.
        dense_compression: Wire format of dense gradients (``fp32``, ``bf16`` or
            ``fp16``); :meth:`create` defaults it to bf16 when ``allow`` names bf16
            (the user accepts lossy formats on the wire), else fp32.
        towers: Towers (DMT) for the automatic plan: a count (the statistics-only
            partitioner), ``"auto"`` (the planner's choice of flat or towers) or tower requests
            (:meth:`create` reads a ``towers.json`` path); None: a flat plan. Through
            the strategy towers are ``identity`` (the model unchanged); a plan may carry
            towers of its own.
        engine: How the engines run (:class:`~lightning_embark.engine.EngineConfig`: the
            store, the init seed of tables still on the ``meta`` device, the input
            pipeline, the lane); the strategy's ``store``, ``seed``, ``pipeline`` and
            ``overlap``.
        metrics: Log the per-step metrics (:mod:`~lightning_embark.sharding._callbacks`:
            bytes intra-/inter-host, exchange, engine and dense time, unique ratios);
            False leaves the trainer's callbacks as the user passed them.
    """

    plan: Plan | None = None
    topology: Topology | str | None = None
    allow: tuple[Compression, ...] = (Compression.FP32,)
    sparse_optimizer: SparseOptimizerSpec | SparseOptimizer | None = None
    unique_ratios: Mapping[str, float] | None = None
    sample_statistics: bool = True
    embedding_grad: str = "mean"
    planner: str = "greedy"
    dense_exchange: str = "hierarchical"
    dense_compression: Compression = Compression.FP32
    towers: int | str | tuple[TowerRequest, ...] | None = None
    engine: EngineConfig = field(default_factory=EngineConfig)
    metrics: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.engine, EngineConfig):
            raise ConfigError(
                f"EmbarkStrategy engine options must be an EngineConfig, got {self.engine!r}"
            )
        if not isinstance(self.metrics, bool):
            raise ConfigError(
                f"EmbarkStrategy metrics must be True or False, got {self.metrics!r}; "
                "metrics=False leaves out the default metrics callbacks"
            )
        object.__setattr__(
            self,
            "dense_compression",
            check_dense_options(self.dense_exchange, self.dense_compression),
        )
        if self.topology is not None and not isinstance(self.topology, (Topology, str)):
            raise ConfigError(
                "EmbarkStrategy topology must be a Topology, a preset name or None, got "
                f"{self.topology!r}"
            )
        if self.sparse_optimizer is not None and not isinstance(
            self.sparse_optimizer, (SparseOptimizerSpec, SparseOptimizer)
        ):
            raise ConfigError(
                "EmbarkStrategy sparse_optimizer must be a "
                "lightning_embark.models.SparseOptimizerSpec, an engine "
                f"SparseOptimizer or None, got {self.sparse_optimizer!r}"
            )
        if self.planner not in PLANNERS:
            raise ConfigError(
                f"EmbarkStrategy planner={self.planner!r} is unknown; use one of {list(PLANNERS)}"
            )
        if self.planner == "torchrec" and self.allow != (Compression.FP32,):
            raise ConfigError(
                "EmbarkStrategy planner='torchrec' plans fp32 exchanges only, but "
                f"allow={[a.value for a in self.allow]}; drop allow, or use planner='greedy'"
            )
        if self.embedding_grad not in EMBEDDING_GRAD_MODES:
            raise ConfigError(
                f"EmbarkStrategy embedding_grad={self.embedding_grad!r} is unknown; "
                f"use one of {list(EMBEDDING_GRAD_MODES)}"
            )
        self._check_towers()
        for name, ratio in (self.unique_ratios or {}).items():
            if not isinstance(ratio, (int, float)) or not 0 < ratio <= 1:
                raise ConfigError(
                    f"EmbarkStrategy unique_ratios[{name!r}] must be in (0, 1], got {ratio!r}"
                )

    def _check_towers(self) -> None:
        towers = self.towers
        if towers is None:
            return
        if self.plan is not None:
            raise ConfigError(
                "EmbarkStrategy got both a plan and towers; put the towers in the plan "
                "(embark-plan --towers) or drop the plan to plan them automatically"
            )
        if self.planner != "greedy":
            raise ConfigError(
                f"EmbarkStrategy towers need planner='greedy' (torchrec's planner has no "
                f"towers), got planner={self.planner!r}"
            )
        if isinstance(towers, bool) or not (
            (isinstance(towers, int) and towers >= 1)
            or towers == "auto"
            or (isinstance(towers, tuple) and all(isinstance(t, TowerRequest) for t in towers))
        ):
            raise ConfigError(
                "EmbarkStrategy towers must be a positive count, 'auto', a towers.json path or "
                f"tower requests, got {towers!r}"
            )
        if isinstance(towers, tuple):
            wrong = [t.name for t in towers if t.module is not TowerModule.IDENTITY]
            if wrong:
                raise ConfigError(
                    f"EmbarkStrategy towers {wrong} have compressing tower modules, which change "
                    "the embedding output the model consumes; through the strategy towers are "
                    "'identity' (build a model over ShardedEmbeddingBagCollection(tower_modules="
                    "...) for compressing ones)"
                )

    @classmethod
    def create(
        cls,
        *,
        plan: Plan | str | Path | None = None,
        allow: Iterable[str | Compression] | str | None = None,
        unique_ratios: Mapping[str, float] | None = None,
        dense_compression: str | Compression | None = None,
        towers: int | str | Path | Iterable[TowerRequest] | None = None,
        store: str = EngineConfig.store,
        seed: int = EngineConfig.seed,
        pipeline: bool = EngineConfig.pipeline,
        overlap: bool = EngineConfig.overlap,
        **kwargs: Any,
    ) -> EmbarkOptions:
        """Options from user-facing arguments: a plan or towers file is read, ``allow``
        parsed, the dense compression defaulted from ``allow``, the engine's options
        gathered into one :class:`~lightning_embark.engine.EngineConfig`."""
        try:
            engine = EngineConfig(store=store, seed=seed, pipeline=pipeline, overlap=overlap)
        except ConfigError as error:
            raise ConfigError(f"EmbarkStrategy: {error}") from None
        allowed = check_allow(allow)
        if isinstance(towers, Path) or (isinstance(towers, str) and towers != "auto"):
            towers = tuple(load_towers(towers))
        elif towers is not None and not isinstance(towers, (int, str)):
            towers = tuple(towers)
        return cls(
            towers=towers,
            plan=None if plan is None else load_plan(plan),
            allow=allowed,
            unique_ratios=dict(unique_ratios) if unique_ratios else None,
            dense_compression=default_dense_compression(allowed)
            if dense_compression is None
            else _compression(dense_compression),
            engine=engine,
            **kwargs,
        )


def _compression(value: str | Compression) -> Compression:
    """``value`` as a :class:`Compression`; an unknown name is left to the options' check."""
    try:
        return Compression(value)
    except ValueError:
        return value  # type: ignore[return-value]  # rejected, with the choices, in __post_init__
