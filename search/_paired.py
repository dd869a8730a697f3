"""The final verdict: top candidates and the greedy plan re-measured in alternating pairs.

Why not take the study's best trial? On a noisy machine the minimum of N single
measurements is biased low (the winner's curse): the trial that looks best is partly the
one that drew the quietest seconds. So the top ``k`` candidates and the greedy plan run
again, ``pairs`` rounds, in alternating order (greedy first in even rounds, last in odd
ones, so drift over the rounds cancels), on the same batches. Round ``r`` gives each
candidate the ratio

    ratio_c,r = median step of c in round r / median step of greedy in round r

and a candidate wins only when its ratios say so: median ratio below 1 and a one-sided
Wilcoxon signed-rank test of ``log ratio < 0`` at ``alpha / k`` (Bonferroni over the
``k`` candidates tried). Otherwise the greedy plan stands.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from lightning_embark.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class PairedCandidate:
    """One candidate's paired ratios against the greedy plan.

    Attributes:
        name: The candidate's label (its trial number).
        ratios: Per round, its median step over the greedy plan's.
        p_value: One-sided Wilcoxon signed-rank p-value of ``ratio < 1``.
    """

    name: str
    ratios: tuple[float, ...]
    p_value: float

    @property
    def median(self) -> float:
        return statistics.median(self.ratios)

    def quantile(self, q: float) -> float:
        ordered = sorted(self.ratios)
        position = q * (len(ordered) - 1)
        low = int(position)
        high = min(low + 1, len(ordered) - 1)
        return ordered[low] + (ordered[high] - ordered[low]) * (position - low)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "ratios": list(self.ratios),
            "median_ratio": self.median,
            "p10_ratio": self.quantile(0.1),
            "p90_ratio": self.quantile(0.9),
            "p_value": self.p_value,
        }


@dataclass(frozen=True, kw_only=True)
class PairedResult:
    """The re-measurement: every candidate's ratios and the verdict.

    Attributes:
        candidates: Every candidate, in the order given.
        winner: The candidate declared faster than greedy, or None: the greedy plan stands.
        alpha: The family-wise significance level.
        greedy_ms: The greedy plan's median step per round (ms).
    """

    candidates: tuple[PairedCandidate, ...]
    winner: str | None
    alpha: float
    greedy_ms: tuple[float, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "candidates": [c.to_dict() for c in self.candidates],
            "winner": self.winner,
            "alpha": self.alpha,
            "greedy_ms": list(self.greedy_ms),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PairedResult:
        return cls(
            candidates=tuple(
                PairedCandidate(name=c["name"], ratios=tuple(c["ratios"]), p_value=c["p_value"])
                for c in data["candidates"]
            ),
            winner=data["winner"],
            alpha=data["alpha"],
            greedy_ms=tuple(data["greedy_ms"]),
        )


def wilcoxon_less(ratios: Sequence[float]) -> float:
    """One-sided p-value that the ratios' logs are centred below 0 (scipy's exact test
    for small samples; 1.0 when every ratio is exactly 1)."""
    from scipy.stats import wilcoxon

    logs = [math.log(r) for r in ratios]
    if all(x == 0 for x in logs):
        return 1.0
    return float(wilcoxon(logs, alternative="less").pvalue)


def paired_remeasure(
    measure: Callable[[str], float],
    candidates: Sequence[str],
    *,
    greedy: str = "greedy",
    pairs: int,
    alpha: float = 0.05,
    on_run: Callable[[str, int, float], None] | None = None,
) -> PairedResult:
    """Re-measure ``candidates`` against ``greedy`` in ``pairs`` alternating rounds.

    Args:
        measure: Runs one candidate (by label) and returns its median step (seconds).
        candidates: Labels of the candidates to try (the greedy plan excluded).
        greedy: The greedy plan's label.
        pairs: Rounds; at least 6, so that the exact one-sided Wilcoxon test can reach
            ``alpha / k`` for a few candidates (its smallest p-value is ``2**-pairs``).
        alpha: Family-wise significance level.
        on_run: Called after each run with (label, round, seconds), for progress.

    Raises:
        ConfigError: ``pairs`` too small, or no candidate.
    """
    if pairs < 2:
        raise ConfigError(f"pairs must be >= 2 for a paired comparison, got {pairs}")
    if not candidates:
        raise ConfigError("no candidate to re-measure against the greedy plan")
    times: dict[str, list[float]] = {c: [] for c in (greedy, *candidates)}
    for r in range(pairs):
        order = [greedy, *candidates] if r % 2 == 0 else [*reversed(candidates), greedy]
        for label in order:
            seconds = measure(label)
            times[label].append(seconds)
            if on_run is not None:
                on_run(label, r, seconds)
    results = []
    for label in candidates:
        ratios = tuple(c / g for c, g in zip(times[label], times[greedy], strict=True))
        results.append(PairedCandidate(name=label, ratios=ratios, p_value=wilcoxon_less(ratios)))
    level = alpha / len(candidates)
    significant = [c for c in results if c.median < 1 and c.p_value < level]
    winner = min(significant, key=lambda c: c.median).name if significant else None
    return PairedResult(
        candidates=tuple(results),
        winner=winner,
        alpha=alpha,
        greedy_ms=tuple(1e3 * t for t in times[greedy]),
    )
