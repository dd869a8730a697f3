"""What one tuning study is: model, cluster, budget, storage (``embark-tune``'s options)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightning_embark.errors import ConfigError
from lightning_embark.plan import Compression

DEFAULT_STORAGE = "sqlite:///embark-tune.db"
PRUNERS = ("wilcoxon", "median", "none")


@dataclass(frozen=True, kw_only=True)
class TuneConfig:
    """A study: the model and data every trial trains, the cluster, the search budget.

    Attributes:
        model: Spec JSON path or preset name.
        max_rows: Cap on rows per table.
        num_hosts: Hosts (emulated unless launched on a real cluster).
        ranks_per_host: Ranks per host.
        batch_size: Per-rank batch size.
        allow: Compressions a candidate may use (fp32 always).
        towers: Also search DMT towers (count and module, as ``towers="auto"`` chooses
            them; several hosts only).
        topology: Calibration preset or JSON the planner and the screen use.
        stats: Statistics JSON (``embark-stats``) for the cost model; None: analytic.
        trials: Trials the study should hold when done (finished ones count on resume).
        timeout_s: Wall-clock budget of the search phase; None: no limit.
        steps: Measured steps per trial.
        warmup: Unmeasured steps before them.
        trial_timeout_s: A trial running longer is failed and its ranks restarted.
        storage: Optuna storage URL, or a journal file path (``*.log`` / ``*.journal``).
        study_name: Study name inside the storage.
        top_k: Candidates re-measured against the greedy plan at the end.
        pairs: Rounds of the paired re-measurement.
        pruner: ``wilcoxon`` (every trial replays the same batches), ``median`` or ``none``.
        screen_margin: A candidate whose rescaled estimate exceeds the best measured
            step by this factor is pruned without a run.
        seed: Data, model and sampler seed.
        interaction: DLRM interaction.
        dense_arch: Bottom MLP hidden sizes.
        over_arch: Top MLP sizes.
        dense_compression: Dense-gradient wire format for every trial; None: bf16 when
            ``allow`` names bf16, else fp32 (the strategy's rule).
        rate_mbit: Emulated inter-host link rate; None: the cluster default.
        delay_ms: Emulated inter-host latency.
        loopback: No emulation: every rank on loopback.
        out: Where the best plan is written.
        plots: Folder for the PNG plots; None: no plots.
        work_dir: Folder for per-rank fault reports and the result; None: next to ``out``.
        max_restarts: Times the ranks are restarted after a crash or hang.
    """

    model: str
    max_rows: int | None = None
    num_hosts: int = 2
    ranks_per_host: int = 2
    batch_size: int = 512
    allow: tuple[str, ...] = ()
    towers: bool = False
    topology: str = "emulated"
    stats: str | None = None
    trials: int = 20
    timeout_s: float | None = None
    steps: int = 8
    warmup: int = 2
    trial_timeout_s: float = 120.0
    storage: str = DEFAULT_STORAGE
    study_name: str = "embark-tune"
    top_k: int = 3
    pairs: int = 7
    pruner: str = "wilcoxon"
    screen_margin: float = 1.5
    seed: int = 0
    interaction: str = "dcn"
    dense_arch: str = "512,256"
    over_arch: str = "1024,1024,512,256,1"
    dense_compression: str | None = None
    rate_mbit: float | None = None
    delay_ms: float = 0.0
    loopback: bool = False
    out: str = "best-plan.json"
    plots: str | None = None
    work_dir: str | None = None
    max_restarts: int = 10

    def __post_init__(self) -> None:
        for name in ("num_hosts", "ranks_per_host", "batch_size", "trials", "steps", "pairs"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ConfigError(
                    f"{name} must be a positive integer, got {getattr(self, name)!r}"
                )
        for name in ("warmup", "top_k", "max_restarts"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        if self.pairs < 2:
            raise ConfigError(f"pairs must be >= 2 for a paired comparison, got {self.pairs}")
        if self.pruner not in PRUNERS:
            raise ConfigError(f"pruner={self.pruner!r}; choose one of {list(PRUNERS)}")
        if not self.screen_margin > 1:
            raise ConfigError(f"screen_margin must be > 1, got {self.screen_margin!r}")
        if not self.trial_timeout_s > 0:
            raise ConfigError(f"trial_timeout_s must be positive, got {self.trial_timeout_s!r}")
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise ConfigError(f"timeout_s must be positive or None, got {self.timeout_s!r}")
        if self.dense_compression not in (None, "fp32", "bf16", "fp16"):
            raise ConfigError(
                f"dense_compression={self.dense_compression!r}; choose fp32, bf16 or fp16"
            )
        object.__setattr__(self, "allow", tuple(self.allow))
        known = [c.value for c in Compression]
        unknown = [a for a in self.allow if a not in known]
        if unknown:
            raise ConfigError(f"allow names unknown compressions {unknown}; choose from {known}")

    @property
    def world_size(self) -> int:
        return self.num_hosts * self.ranks_per_host

    @property
    def resolved_dense_compression(self) -> str:
        if self.dense_compression is not None:
            return self.dense_compression
        return "bf16" if "bf16" in self.allow else "fp32"

    @property
    def run_dir(self) -> Path:
        """Where ranks leave fault reports and rank 0 the result JSON."""
        if self.work_dir is not None:
            return Path(self.work_dir)
        out = Path(self.out)
        return out.with_name(out.stem + ".tune")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TuneConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ConfigError(f"unknown TuneConfig fields {unknown}; known: {sorted(names)}")
        return cls(**data)
