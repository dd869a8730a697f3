"""Running strategies side by side on one emulated cluster: the library behind ``embark-bench``.

Each run is announced on stderr (``[embark-bench] strategy 2/3: embark``) and shows rank 0's
progress bar (:mod:`._progress`); the result records the link the runs crossed and the
machine they ran on, since a step time means little without either.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import platform
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning_embark.harness._report as report
import lightning_embark.harness._worker as worker
from lightning_embark.errors import ConfigError, EmbarkError
from lightning_embark.registry import STRATEGIES

KNOWN_STRATEGIES = (*STRATEGIES, *worker.TOWERED_BASELINES)


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
    pipeline: bool = True
    overlap: bool = True
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
            if strategy in worker.TOWER_RUNS and not Path(self.towers).is_file():
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

    def worker_argv(
        self, strategy: str, out_dir: Path, label: str | None = None, position: str | None = None
    ) -> list[str]:
        """The worker's command line for one run (``label`` from :meth:`runs`; ``position``,
        e.g. ``2/3``, for its progress bar)."""
        argv = [
            str(Path(worker.__file__).resolve()),
            "--strategy",
            strategy,
            "--label",
            label or strategy,
            "--model",
            self.model,
            "--batch-size",
            str(self.batch_size),
            "--steps",
            str(self.steps),
            "--warmup",
            str(self.warmup),
            "--seed",
            str(self.seed),
            "--interaction",
            self.interaction,
            "--dense-arch",
            self.dense_arch,
            "--over-arch",
            self.over_arch,
            "--val-batches",
            str(self.val_batches),
            "--out-dir",
            str(out_dir),
        ]
        if position is not None:
            argv += ["--position", position]
        if self.max_rows is not None:
            argv += ["--max-rows", str(self.max_rows)]
        if strategy == "embark" and self.plan is not None:
            argv += ["--plan", self.plan]
        if strategy in ("embark", "embark-towers") and self.allow:
            argv += ["--allow", ",".join(self.allow)]
        if strategy in worker.TOWER_RUNS:
            module = (label or strategy).partition(":")[2] or "identity"
            argv += ["--towers", self.towers, "--tower-module", module]
            if module != "identity" and self.tower_ratio is not None:
                argv += ["--tower-ratio", str(self.tower_ratio)]
        if strategy == "embark-towers":
            argv += ["--tower-compression", self.tower_compression]
        if self.pipeline:
            argv.append("--pipeline")
        if self.overlap and strategy.startswith("embark"):
            argv.append("--overlap")
        if self.profile:
            argv.append("--profile")
        argv += ["--dense-compression", self.dense_format]
        if self.dense_exchange is not None:
            argv += ["--dense-exchange", self.dense_exchange]
        return argv

    @property
    def dense_format(self) -> str:
        """The dense all-reduce's wire format of every run (see ``dense_compression``)."""
        if self.dense_compression is not None:
            return self.dense_compression
        from lightning_embark.plan import Compression
        from lightning_embark.sharding import default_dense_compression

        return default_dense_compression(tuple(Compression(c) for c in self.allow)).value


def run_benchmark(config: BenchConfig, *, work_dir: Path | None = None) -> dict[str, Any]:
    """Run every strategy on one emulated cluster and return the result JSON.

    Raises:
        EmbarkError: a strategy's job failed (its logs were streamed above).
    """
    from lightning_embark.emulation import EmulatedHosts, EmulationConfig

    link: dict[str, Any] = {"rate_mbit": config.rate_mbit} if config.rate_mbit is not None else {}
    cluster_config = EmulationConfig(
        num_hosts=config.num_hosts,
        ranks_per_host=config.ranks_per_host,
        delay_ms=config.delay_ms,
        **link,
    )
    runs: list[dict[str, Any]] = []
    planned = config.runs()
    with tempfile.TemporaryDirectory(prefix="embark-bench-") as tmp:
        root = Path(work_dir or tmp)
        with EmulatedHosts(cluster_config, force_loopback=config.loopback) as cluster:
            cluster.set_shaped(not config.unshaped)
            print(f"[embark-bench] {cluster.describe()}", file=sys.stderr, flush=True)
            for index, (label, strategy) in enumerate(planned, start=1):
                position = f"{index}/{len(planned)}"
                links = [not config.unshaped]
                if config.exposed:  # both links, back to back, alternating which goes first
                    links = [True, False] if index % 2 else [False, True]
                measured: dict[bool, dict[str, Any]] = {}
                for shaped in links:
                    cluster.set_shaped(shaped)
                    suffix = "" if not config.exposed else " (shaped)" if shaped else " (unshaped)"
                    print(
                        f"[embark-bench] strategy {position}: {label}{suffix}",
                        file=sys.stderr,
                        flush=True,
                    )
                    out_dir = root / (label.replace(":", "-") + ("" if shaped else "-unshaped"))
                    measured[shaped] = _run_one(
                        config, cluster, label, strategy, out_dir, position
                    )
                run = measured[links[0]] if not config.exposed else measured[True]
                if config.exposed:
                    run |= exposed_fields(run, measured[False])
                runs.append(run)
            cluster.set_shaped(not config.unshaped)
            rate, rate_source = applied_rate(config, cluster.mode, cluster.config.rate_mbit)
            cluster_info = {
                "mode": cluster.mode,
                "description": cluster.describe(),
                "rate_source": rate_source,
            }
    return {
        "config": dataclasses.asdict(config)
        | {
            "rate_mbit": rate,
            "cluster": cluster_info,
            "machine": machine_info(),
            "spec": runs[0]["spec"],
        },
        "runs": runs,
    }


def _run_one(
    config: BenchConfig,
    cluster: Any,
    label: str,
    strategy: str,
    out_dir: Path,
    position: str,
) -> dict[str, Any]:
    """One strategy's job on ``cluster`` as it is now (shaped or not), summarised.

    Raises:
        EmbarkError: the job failed (its logs were streamed above).
    """
    from lightning_embark.emulation import QUIET_RANK_ENV

    argv = config.worker_argv(strategy, out_dir, label, position)
    with _progress_in_place():
        code = cluster.run(argv, env=QUIET_RANK_ENV)
    if code != 0:
        raise EmbarkError(f"strategy {label!r} failed with exit code {code}; see the logs above")
    records = report.load_rank_records(out_dir)
    run = report.summarize_run(label, records, warmup=config.warmup)
    run["link"] = "shaped" if cluster.mode == "netns" and cluster.shaped else "unshaped"
    run["spec"] = records[0]["spec"]
    if config.val_batches:
        run["validation"] = records[0].get("validation", {})
    if "plan" in records[0]:
        run["plan"] = records[0]["plan"]
    if config.profile and strategy.startswith("embark"):
        run["profile"] = _profile(config, records, cluster.mode, cluster.config)
    if config.profile:
        from lightning_embark.harness._profile import summarize_dispatch

        run["dispatch"] = summarize_dispatch(records)
    return run


def exposed_fields(shaped: dict[str, Any], unshaped: dict[str, Any]) -> dict[str, Any]:
    """What the link cost a run: its median step on the shaped link minus the same step's
    on the unshaped one (``exposed_ms``), that over the shaped step (``exposed_share``),
    and the unshaped run's own figures."""
    on, off = shaped["step_time_ms"]["median"], unshaped["step_time_ms"]["median"]
    return {
        "unshaped": {
            "step_time_ms": unshaped["step_time_ms"],
            "cpu_ms_per_rank": unshaped.get("cpu_ms_per_rank"),
            "comm_share": unshaped["comm_share"],
        },
        "exposed_ms": on - off,
        "exposed_share": (on - off) / on if on > 0 else 0.0,
    }


def _profile(
    config: BenchConfig, records: list[dict[str, Any]], mode: str, cluster: Any
) -> list[dict[str, Any]]:
    """A profiled run's per-cluster, per-phase exchanges against the applied link rate."""
    from lightning_embark.harness._profile import summarize_profile

    num_steps = min(len(r["step_seconds"]) for r in records)
    rate, _ = applied_rate(config, mode, cluster.rate_mbit)
    return summarize_profile(
        records,
        range(config.warmup, num_steps),
        ranks_per_host=cluster.ranks_per_host,
        rate_mbit=rate,
    )


def applied_rate(
    config: BenchConfig, mode: str, cluster_rate: float | None
) -> tuple[float | None, str]:
    """The inter-host rate the runs crossed, in Mbit/s, and where it came from.

    Shaped links (``netns`` mode) have a rate: ``--rate-mbit``'s or the emulation's
    default, which ``tc`` applied. On loopback (``--loopback``, or the fallback when no
    namespace could be created) nothing is shaped and there is no rate: None.
    """
    if mode != "netns":
        reason = "--loopback" if config.loopback else "namespaces could not be created"
        return None, f"none: loopback ({reason}), not emulated, no shaped link"
    if config.unshaped:
        return None, "none: unshaped veths (--unshaped)"
    assert cluster_rate is not None, "the bench always shapes its emulated links"
    return float(cluster_rate), "--rate-mbit" if config.rate_mbit is not None else "default"


def machine_info() -> dict[str, Any]:
    """What the runs ran on: CPU model, cores, and the versions that shape a step time."""
    import torch

    model = None
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "cpu model"):
                model = value.strip()
                break
    affinity = getattr(os, "sched_getaffinity", None)  # Linux only
    usable = len(affinity(0)) if affinity is not None else os.cpu_count()
    return {
        "cpu_model": model or platform.processor() or None,
        "cpu_count": os.cpu_count(),
        "cpus_usable": usable,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


@contextlib.contextmanager
def _progress_in_place() -> Iterator[None]:
    """On a terminal, ``sys.stdout`` redraws rank 0's progress lines over each other while
    the block runs (:class:`~._progress.InPlaceProgress`); elsewhere (a log, a pipe, a
    test's capture) they stay lines."""
    from lightning_embark.harness._progress import InPlaceProgress

    if not sys.stdout.isatty():
        yield
        return
    stream = InPlaceProgress(sys.stdout)
    try:
        with contextlib.redirect_stdout(stream):
            yield
    finally:
        stream.end_line()  # before the bench or a failing host prints anything
        stream.flush()
