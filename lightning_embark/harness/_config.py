"""What a benchmark runs: :class:`BenchConfig` (the bench's options, checked before any job
starts) and :class:`RankJob` (one run of one strategy, as every rank reads it).

The ranks get their run as JSON (:meth:`RankJob.to_json`), the config whole: the worker
decides per strategy what applies to it (a plan, ``allow`` and ``overlap`` configure the
embark runs only) from the same fields the bench was given, so an option is declared and
defaulted once, here.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightning_embark.engine import EngineConfig
from lightning_embark.errors import ConfigError
from lightning_embark.registry import STRATEGIES

#: Bench runs that are a registered strategy over the model with the run's towers rather
#: than strategies of their own: torchrec's ``DistributedModelParallel`` shards a model's
#: ``EmbeddingTowerCollection`` with torchrec's tower sharding
#: (:mod:`lightning_embark.baseline`), so ``torchrec-towers`` is ``torchrec`` over the same
#: towers ``embark-towers`` trains.
TOWERED_BASELINES: dict[str, str] = {"torchrec-towers": "torchrec"}

#: The bench runs that build towers from ``towers``, ``tower_modules`` and ``tower_ratio``.
TOWER_RUNS = ("embark-towers", *TOWERED_BASELINES)

KNOWN_STRATEGIES = (*STRATEGIES, *TOWERED_BASELINES)


@dataclass(frozen=True, kw_only=True)
class BenchConfig:
    """What to run and on which (emulated) cluster.

    Attributes:
        model: Spec JSON path or preset name.
        max_rows: Cap on rows per table (communication volume does not depend on rows).
        num_hosts: Emulated hosts.
        ranks_per_host: Ranks per host.
        batch_size: Per-rank batch size.
        steps: Measured steps per strategy.
        warmup: Steps run before measuring.
        strategies: Strategy names, run in order; the first is the ratio baseline.
        rate_mbit: Inter-host link rate; None uses the cluster default
            (:data:`lightning_embark.emulation.DEFAULT_RATE_MBIT`), which the result's
            config records.
        delay_ms: Added inter-host latency.
        interaction: DLRM interaction, ``dcn`` (DLRM-DCNv2) or ``dot``.
        dense_arch: Bottom MLP hidden sizes (the embedding width is appended).
        over_arch: Top MLP sizes.
        seed: Data and model seed, the same for every strategy.
        val_batches: Validation batches after training (0: none).
        loopback: Skip emulation and run every rank on plain loopback.
        plan: Plan JSON for the ``embark`` strategy; None plans automatically.
        allow: Compressions the automatic ``embark`` plan may use (empty: lossless only).
        dense_compression: Wire format of every run's dense-gradient all-reduce (embark's
            host-aware one, torchrec's DDP); None: one default for every run, bf16 when
            ``allow`` names bf16, else fp32 (:attr:`dense_format`), so that rows differ
            in their embedding exchange only. Each run records the one it used.
        towers: The tower runs' towers (``embark-towers``, ``torchrec-towers``): a count,
            ``auto`` (one per host) or a ``towers.json``.
        dense_exchange: How every run's dense gradients cross ranks: ``flat`` (one
            all-reduce over every rank) or ``hierarchical`` (reduced inside each host first,
            embark's default, given to torchrec's DDP too); None: each strategy's own, so that
            rows differ in their dense exchange too (each run records its own).
        tower_modules: One ``embark-towers`` run per tower module (``identity``,
            ``projection``, ``dcn``), reported as ``embark-towers:<module>``; one
            ``torchrec-towers`` run per compressing module (torchrec's tower sharding
            cannot wrap an identity tower, see
            :data:`lightning_embark.baseline.PARAMETERLESS_TOWER_REASON`).
        tower_ratio: ``D_t / O_t`` of the compressing tower modules.
        tower_compression: Wire format of the ``embark-towers`` outputs and their
            gradients (``torchrec-towers`` exchanges fp32, as ``torchrec`` does).
        pipeline: Every run trains through its strategy's input pipeline, as a user of it
            runs it: torchrec's ``TrainPipelineSparseDist`` (``TorchrecStrategy(pipeline=True)``;
            not ``torchrec-towers``), embark's IDs a step ahead (``EmbarkStrategy``'s default).
            False runs every strategy without one.
        overlap: The embark runs issue each cluster's exchanges from the engine's lane,
            overlapping the next cluster's lookups (``EmbarkStrategy``'s default); False
            runs them in turn.
        unshaped: The emulated hosts' links are left unshaped (the veths' own rate, no
            delay): the same step with no link cost.
        exposed: Every run twice, on the shaped link and unshaped, back to back in
            alternating order; each run records the unshaped step and the difference, its
            *exposed communication*: what the link costs the step, whatever any counter says.
        profile: The embark runs record each cluster's exchanges per phase (header, ids,
            rows, grads, sync) and each run gets a ``profile``: time, inter-host bytes and
            efficiency against the applied link rate (:mod:`._profile`); every run gets a
            ``dispatch``: one step's ATen ops, would-be host syncs and collectives per rank.
    """

    model: str
    max_rows: int | None = None
    num_hosts: int = 2
    ranks_per_host: int = 2
    batch_size: int = 512
    steps: int = 20
    warmup: int = 3
    strategies: tuple[str, ...] = ("torchrec", "torchrec-fp16")
    rate_mbit: float | None = None
    delay_ms: float = 0.0
    interaction: str = "dcn"
    dense_arch: str = "512,256"
    over_arch: str = "1024,1024,512,256,1"
    seed: int = 0
    val_batches: int = 0
    loopback: bool = False
    plan: str | None = None
    allow: tuple[str, ...] = ()
    dense_compression: str | None = None
    dense_exchange: str | None = None
    towers: str = "auto"
    tower_modules: tuple[str, ...] = ("identity",)
    tower_ratio: float | None = None
    tower_compression: str = "fp32"
    pipeline: bool = EngineConfig.pipeline
    overlap: bool = EngineConfig.overlap
    unshaped: bool = False
    exposed: bool = False
    profile: bool = False

    def __post_init__(self) -> None:
        if not self.strategies:
            raise ConfigError("strategies is empty; pass e.g. --strategies torchrec,torchrec-fp16")
        for name in self.strategies:
            if name not in KNOWN_STRATEGIES:
                raise ConfigError(
                    f"unknown strategy {name!r}; known strategies: {list(KNOWN_STRATEGIES)}"
                )
        for field in ("num_hosts", "ranks_per_host", "batch_size", "steps"):
            if getattr(self, field) < 1:
                raise ConfigError(f"{field} must be >= 1, got {getattr(self, field)}")
        if self.exposed and (self.unshaped or self.loopback):
            raise ConfigError(
                "exposed runs every strategy on the shaped link and again unshaped; drop "
                "--unshaped / --loopback"
            )
        if self.warmup < 0:
            raise ConfigError(f"warmup must be >= 0, got {self.warmup}")
        if self.interaction not in ("dcn", "dot"):
            raise ConfigError(f"interaction must be 'dcn' or 'dot', got {self.interaction!r}")
        self._check_embark_options()
        self._check_tower_options()

    def _check_tower_options(self) -> None:
        """The ``embark-towers`` options, checked before any job starts."""
        from lightning_embark.plan import Compression, TowerModule

        object.__setattr__(self, "tower_modules", tuple(self.tower_modules))
        known = [m.value for m in TowerModule if m is not TowerModule.CUSTOM]
        unknown = [m for m in self.tower_modules if m not in known]
        if unknown or not self.tower_modules:
            raise ConfigError(f"tower modules {list(self.tower_modules)}: choose from {known}")
        if self.tower_compression not in [c.value for c in Compression]:
            raise ConfigError(
                f"tower_compression={self.tower_compression!r}; choose from "
                f"{[c.value for c in Compression]}"
            )
        from_file = Path(self.towers).is_file()
        if not (from_file or self.towers == "auto" or self.towers.isdigit()):
            raise ConfigError(
                f"towers={self.towers!r}: give auto, a tower count or an existing towers.json"
            )
        if from_file:
            object.__setattr__(self, "towers", str(Path(self.towers).resolve()))
        compressing = [m for m in self.tower_modules if m != "identity"]
        if compressing and self.tower_ratio is None and not from_file:
            raise ConfigError(f"tower modules {compressing} need tower_ratio (--tower-ratio R)")
        if from_file and (self.tower_modules != ("identity",) or self.tower_ratio is not None):
            raise ConfigError(
                f"towers file {self.towers!r} says each tower's module and width; drop the tower "
                "module and ratio options"
            )
        if "torchrec-towers" in self.strategies:
            self._check_torchrec_towers(from_file)

    def _check_torchrec_towers(self, from_file: bool) -> None:
        """``torchrec-towers`` needs compressing towers: torchrec wraps each tower module in
        DDP, which refuses one without parameters."""
        from lightning_embark.baseline import PARAMETERLESS_TOWER_REASON
        from lightning_embark.plan import TowerModule, load_towers

        if from_file:
            identity = [
                t.name for t in load_towers(self.towers) if t.module is TowerModule.IDENTITY
            ]
            where = f"towers file {self.towers!r} has identity towers {identity}"
        else:
            identity = [] if set(self.tower_modules) - {"identity"} else ["identity"]
            where = "the tower modules are identity only"
        if identity:
            raise ConfigError(
                f"torchrec-towers cannot run identity towers ({where}): "
                f"{PARAMETERLESS_TOWER_REASON}; give --tower-module projection or dcn with "
                "--tower-ratio R, or drop torchrec-towers"
            )

    def runs(self) -> list[tuple[str, str]]:
        """``(label, strategy)`` of every run in order: ``embark-towers`` once per tower
        module, ``torchrec-towers`` once per compressing one (each once, unlabelled, for a
        towers file, which names its own modules)."""
        out = []
        for strategy in self.strategies:
            if strategy in TOWER_RUNS and not Path(self.towers).is_file():
                modules = [
                    m for m in self.tower_modules if strategy == "embark-towers" or m != "identity"
                ]
                out += [(f"{strategy}:{m}", strategy) for m in modules]
            else:
                out.append((strategy, strategy))
        return out

    def _check_embark_options(self) -> None:
        """``plan`` and ``allow`` configure the embark run only; check them before any job
        starts."""
        from lightning_embark.plan import Compression, Plan

        object.__setattr__(self, "allow", tuple(self.allow))
        if self.plan is not None and "embark" not in self.strategies:
            raise ConfigError(
                "plan configures the embark strategy, which is not in strategies "
                f"{list(self.strategies)}; add it, e.g. --strategies torchrec,embark"
            )
        if self.allow and not {"embark", "embark-towers"} & set(self.strategies):
            raise ConfigError(
                "allow configures the embark strategies, none of which is in strategies "
                f"{list(self.strategies)}; add one, e.g. --strategies torchrec,embark"
            )
        if self.dense_exchange not in (None, "flat", "hierarchical"):
            raise ConfigError(
                f"dense_exchange={self.dense_exchange!r}; choose flat or hierarchical (or "
                "none: each strategy's own)"
            )
        if self.dense_compression not in (None, "fp32", "bf16", "fp16"):
            raise ConfigError(
                f"dense_compression={self.dense_compression!r}; choose fp32, bf16 or fp16"
            )
        if self.plan is not None and self.allow:
            raise ConfigError(
                "give either plan (a fixed plan) or allow (for the automatic plan), not both"
            )
        known = [c.value for c in Compression]
        unknown = [a for a in self.allow if a not in known]
        if unknown:
            raise ConfigError(f"allow names unknown compressions {unknown}; choose from {known}")
        if self.plan is not None:
            plan = Plan.load(self.plan)  # a clear error now rather than one per rank later
            world = self.num_hosts * self.ranks_per_host
            if plan.world_size != world:
                raise ConfigError(
                    f"plan {self.plan!r} is for {plan.world_size} ranks but the cluster has "
                    f"{world} ({self.num_hosts} hosts x {self.ranks_per_host}); re-plan or change "
                    "--hosts/--ranks-per-host"
                )
            object.__setattr__(self, "plan", str(Path(self.plan).resolve()))

    @property
    def dense_format(self) -> str:
        """The dense all-reduce's wire format of every run (see ``dense_compression``)."""
        if self.dense_compression is not None:
            return self.dense_compression
        from lightning_embark.plan import Compression
        from lightning_embark.sharding import default_dense_compression

        return default_dense_compression(tuple(Compression(c) for c in self.allow)).value


@dataclass(frozen=True, kw_only=True)
class RankJob:
    """One run as every rank of its job reads it.

    Attributes:
        config: The bench's config, whole.
        strategy: The strategy this run trains (one of ``config.strategies``).
        label: The run's name (:meth:`BenchConfig.runs`: ``embark-towers:<module>`` for a
            tower run); None: the strategy's.
        position: The run's place, e.g. ``2/3``, for its progress bar.
        out_dir: Where each rank writes ``rank{R}.json``.
    """

    config: BenchConfig
    strategy: str
    label: str | None = None
    position: str | None = None
    out_dir: Path

    def __post_init__(self) -> None:
        if self.strategy not in self.config.strategies:
            raise ConfigError(
                f"run strategy {self.strategy!r} is not among the bench's strategies "
                f"{list(self.config.strategies)}"
            )
        object.__setattr__(self, "out_dir", Path(self.out_dir))

    @property
    def name(self) -> str:
        """The run's name (its label, else its strategy)."""
        return self.label or self.strategy

    @property
    def tower_module(self) -> str:
        """A tower run's tower module (from its label; ``identity`` unlabelled)."""
        return self.name.partition(":")[2] or "identity"

    @property
    def tower_ratio(self) -> float | None:
        """A tower run's ``D_t / O_t``: the config's, for compressing modules only."""
        return None if self.tower_module == "identity" else self.config.tower_ratio

    def to_json(self) -> str:
        """The job as the ranks read it (:meth:`from_json`)."""
        return json.dumps(
            {
                "config": dataclasses.asdict(self.config),
                "strategy": self.strategy,
                "label": self.label,
                "position": self.position,
                "out_dir": str(self.out_dir),
            }
        )

    @classmethod
    def from_json(cls, text: str) -> RankJob:
        """The job :meth:`to_json` wrote (the config checked again, as on the bench)."""
        data: dict[str, Any] = json.loads(text)
        config: dict[str, Any] = data.pop("config")
        fields: dict[str, Any] = {
            k: tuple(v) if isinstance(v, list) else v for k, v in config.items()
        }
        return cls(config=BenchConfig(**fields), **data)
