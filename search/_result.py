"""What a study ends with: :class:`TuneResult`, the greedy baseline, every trial, the paired
verdict and where the best plan went, and :func:`format_result`, the table
``embark-tune`` prints.

Rank 0 builds it (:func:`._report.finish`) and writes it as JSON into the run folder; the
launcher reads it back (:func:`._driver.tune`), so the result crosses a process boundary
and ``to_dict`` / ``from_dict`` round-trip it exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightning_embark.plan import Plan
from lightning_embark.search._paired import PairedResult


@dataclass(frozen=True, kw_only=True)
class TuneResult:
    """The outcome of one ``embark-tune`` study.

    Attributes:
        storage: The Optuna storage holding the study.
        study_name: The study's name in it.
        artifact_id: The Optuna artifact id of the uploaded best-plan file.
        greedy_trial: The trial number of the greedy plan (the baseline).
        greedy_ms: Its measured median step, ms (None if it never finished).
        greedy_predicted_ms: The cost model's estimate of it, ms.
        trials: One row per trial (:func:`._report.trial_rows`).
        paired: The paired re-measurement, None when no candidate differed from greedy.
        winner: The trial shown faster than greedy in paired runs, or None (greedy stands).
        gain: ``1 - median paired ratio`` of the winner, or None.
        screen: How the cost-model screen did (:func:`._report.screen_record`).
        rank_correlation: Spearman correlation of estimated and measured steps.
        best_plan: The plan file written (the winner's, else the greedy plan).
        plots: PNGs written, if any.
    """

    storage: str
    study_name: str
    artifact_id: str
    greedy_trial: int
    greedy_ms: float | None
    greedy_predicted_ms: float | None
    trials: tuple[dict[str, Any], ...]
    paired: PairedResult | None
    winner: int | None
    gain: float | None
    screen: dict[str, Any]
    rank_correlation: float | None
    best_plan: Path
    plots: tuple[str, ...] = ()

    @property
    def plan(self) -> Plan:
        """The best plan, read from :attr:`best_plan`."""
        return Plan.load(self.best_plan)

    @property
    def dashboard(self) -> str:
        """The command that browses the study."""
        return f"optuna-dashboard {self.storage}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "study": {
                "storage": self.storage,
                "study_name": self.study_name,
                "dashboard": self.dashboard,
                "artifact_id": self.artifact_id,
            },
            "greedy": {
                "trial": self.greedy_trial,
                "measured_ms": self.greedy_ms,
                "predicted_ms": self.greedy_predicted_ms,
            },
            "trials": list(self.trials),
            "paired": self.paired.to_dict() if self.paired is not None else None,
            "winner": self.winner,
            "gain": self.gain,
            "screen": self.screen,
            "rank_correlation": self.rank_correlation,
            "best_plan": str(self.best_plan),
            "plots": list(self.plots),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TuneResult:
        paired = data["paired"]
        return cls(
            storage=data["study"]["storage"],
            study_name=data["study"]["study_name"],
            artifact_id=data["study"]["artifact_id"],
            greedy_trial=data["greedy"]["trial"],
            greedy_ms=data["greedy"]["measured_ms"],
            greedy_predicted_ms=data["greedy"]["predicted_ms"],
            trials=tuple(data["trials"]),
            paired=PairedResult.from_dict(paired) if paired is not None else None,
            winner=data["winner"],
            gain=data["gain"],
            screen=data["screen"],
            rank_correlation=data["rank_correlation"],
            best_plan=Path(data["best_plan"]),
            plots=tuple(data["plots"]),
        )


def _ms(value: float | None) -> str:
    """Milliseconds to 3 significant digits (datasheet estimates can be far below 1 ms)."""
    return "-" if value is None else f"{value:.3g}"


def format_result(result: TuneResult) -> str:
    """The final table and verdict, as ``embark-tune`` prints them."""
    lines = [
        f"{'trial':>5}  {'state':<8} {'estimate':>9} {'median':>8} {'p10-p90':>13}  "
        "parameters that differ from greedy / note"
    ]
    for row in result.trials:
        spread = f"{row['p10_ms']:.1f}-{row['p90_ms']:.1f}" if row["p10_ms"] is not None else "-"
        params = ", ".join(
            f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
            for k, v in row["params"].items()
        )
        text = "; ".join(x for x in (params, row["note"]) if x)
        lines.append(
            f"{row['number']:>5}  {row['state'].lower():<8} {_ms(row['predicted_ms']):>9} "
            f"{_ms(row['measured_ms']):>8} {spread:>13}  {text}"
        )
    paired = result.paired
    if paired is not None:
        lines.append("")
        lines.append(
            f"paired re-measurement ({len(paired.greedy_ms)} alternating rounds, ratio = "
            "candidate / greedy step):"
        )
        for c in paired.candidates:
            lines.append(
                f"  trial {c.name:>3}: median {c.median:.3f} "
                f"(p10-p90 {c.quantile(0.1):.3f}-{c.quantile(0.9):.3f}), "
                f"one-sided Wilcoxon p={c.p_value:.4f}"
            )
    if result.winner is not None and result.gain is not None:
        lines.append(
            f"winner: trial {result.winner}, {100 * result.gain:.1f}% below the greedy "
            "plan's step in paired runs"
        )
    else:
        lines.append(
            "verdict: no candidate was shown faster in paired runs; the greedy plan stands"
        )
    screen = result.screen
    lines.append(
        f"screen: {screen['pruned_by_estimate']} pruned by estimate, {screen['infeasible']} "
        f"infeasible; of {screen['let_through']} runs it let through, "
        f"{screen['let_through_within_margin']} came within {screen['margin']:g}x of the best"
    )
    rho = result.rank_correlation
    if rho is not None:
        lines.append(f"cost model's rank correlation on the study's plans: {rho:.2f}")
    lines.append(f"best plan: {result.best_plan}")
    for path in result.plots:
        lines.append(f"plot: {path}")
    lines.append(f"browse: {result.dashboard}")
    return "\n".join(lines)
