"""Rank 0's objective: candidate plan, cost-model screen, cache, measured run, report.

Per trial, in this order:

1. **Plan.** The trial's knobs and overrides build a plan through the greedy planner
   (:mod:`._space`). Knobs that leave no layout fitting memory, or a plan whose estimated
   memory (blocks plus exchange buffers) exceeds a rank's, set the constraint
   ``memory_shortfall_gib`` > 0 and the trial is pruned without a run.
2. **Cache.** A plan equal to one measured before (canonical JSON) returns that trial's
   result again (``cached_from``) instead of running.
3. **Screen.** The cost model's estimate is rescaled to this machine by the median
   measured/estimated ratio of the trials measured so far, ``s``; a candidate with
   ``s * estimate > margin * best measured`` is pruned without a run (``screen=estimate``).
   The rescaling keeps a model whose constants are off by a constant factor (datasheet
   numbers on a CPU cluster) useful for ranking; a model that ranks wrongly is caught by
   what the screen lets through, which the report counts.
4. **Run.** Every rank trains the plan (:mod:`._measure`); each measured step's
   slowest-rank time goes to ``trial.report``, and the pruner may stop the run early.
   The trial's value is the median step (ms); its user attributes keep the plan, the
   estimate's breakdown and the measured quantiles, so the study is the record of what
   was predicted and what happened (``embark-calibrate --from-study`` reads it).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

import optuna

from lightning_embark.errors import PlanInfeasibleError
from lightning_embark.planner import CostModel
from lightning_embark.search._measure import Measured
from lightning_embark.search._space import SearchSpace, plan_key

GIB = 2.0**30

#: Runs a plan on every rank: (plan dict, the trial, on_step) -> Measured.
RunPlan = Callable[[dict[str, Any], optuna.Trial, Callable[[int, float], bool]], Measured]


def slowest_rank(estimate: Any) -> dict[str, float]:
    """The estimate's breakdown on its slowest rank (what a step waits for)."""
    rank = max(estimate.per_rank, key=lambda r: r.total_ms)
    return {
        k: float(getattr(rank, k))
        for k in ("compute_ms", "intra_ms", "inter_ms", "latency_ms", "allreduce_ms", "total_ms")
    }


def measured_trials(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """Trials that ran to the end (not cached, not screened): the study's own evidence."""
    return [
        t
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        if "measured_ms" in t.user_attrs and "cached_from" not in t.user_attrs
    ]


class Objective:
    """The study's objective on rank 0 (see the module docstring).

    Args:
        space: The search space.
        model: The cost model (the topology the user gave; possibly uncalibrated).
        run: Runs a plan on every rank.
        margin: The screen's factor over the best measured step.
        memory_per_rank: Bytes a rank has for blocks and buffers; None: unlimited.
    """

    def __init__(
        self,
        *,
        space: SearchSpace,
        model: CostModel,
        run: RunPlan,
        margin: float,
        memory_per_rank: float | None,
    ) -> None:
        self.space, self.model, self.run = space, model, run
        self.margin, self.memory_per_rank = margin, memory_per_rank

    def __call__(self, trial: optuna.Trial) -> float:
        try:
            plan, _ = self.space.plan(trial, self.model)
        except PlanInfeasibleError as error:
            return self._infeasible(trial, str(error), error.shortfall_bytes)
        estimate = self.model.estimate(plan)
        over = (
            estimate.max_memory_bytes - self.memory_per_rank
            if self.memory_per_rank is not None
            else -1.0
        )
        if over > 0:
            return self._infeasible(
                trial,
                f"estimated memory {estimate.max_memory_bytes / GIB:.2f} GiB per rank exceeds "
                f"{self.memory_per_rank / GIB:.2f} GiB",  # type: ignore[operator]
                over,
            )
        trial.set_constraint("memory_shortfall_gib", over / GIB)
        trial.set_user_attr("plan", plan.to_dict())
        trial.set_user_attr("predicted_ms", estimate.step_time_ms)
        trial.set_user_attr("predicted", slowest_rank(estimate))
        study = trial.study
        key = plan_key(plan)
        for earlier in study.get_trials(
            deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)
        ):
            if (
                "measured_ms" in earlier.user_attrs
                and earlier.user_attrs.get("plan")
                and (plan_key(_plan(earlier)) == key)
            ):
                return self._cached(trial, earlier)
        self._screen(trial, study, estimate.step_time_ms)

        def on_step(step: int, seconds: float) -> bool:
            trial.report(1e3 * seconds, step)
            return trial.should_prune()

        measured = self.run(plan.to_dict(), trial, on_step)
        if measured.step_seconds:
            trial.report(1e3 * measured.step_seconds[-1], len(measured.step_seconds) - 1)
        ms = [1e3 * s for s in measured.step_seconds]
        trial.set_user_attr("step_ms", ms)
        if measured.stopped:
            trial.set_user_attr("pruned_at_step", len(ms))
            raise optuna.TrialPruned(f"pruned after {len(ms)} measured steps")
        median = 1e3 * measured.median
        trial.set_user_attr("measured_ms", median)
        trial.set_user_attr("p10_ms", _quantile(ms, 0.1))
        trial.set_user_attr("p90_ms", _quantile(ms, 0.9))
        return median

    def _infeasible(self, trial: optuna.Trial, reason: str, shortfall_bytes: float) -> float:
        trial.set_constraint("memory_shortfall_gib", max(shortfall_bytes / GIB, 1e-9))
        trial.set_user_attr("screen", "memory")
        trial.set_user_attr("reason", reason)
        raise optuna.TrialPruned(f"does not fit memory: {reason}")

    def _cached(self, trial: optuna.Trial, earlier: optuna.trial.FrozenTrial) -> float:
        trial.set_user_attr("cached_from", earlier.number)
        for name in ("measured_ms", "p10_ms", "p90_ms", "step_ms"):
            trial.set_user_attr(name, earlier.user_attrs[name])
        for step, value in enumerate(earlier.user_attrs["step_ms"]):
            trial.report(value, step)
        return float(earlier.user_attrs["measured_ms"])

    def _screen(self, trial: optuna.Trial, study: optuna.Study, predicted_ms: float) -> None:
        evidence = measured_trials(study)
        if not evidence:
            return
        scale = statistics.median(
            t.user_attrs["measured_ms"] / t.user_attrs["predicted_ms"] for t in evidence
        )
        best = min(t.user_attrs["measured_ms"] for t in evidence)
        scaled = scale * predicted_ms
        trial.set_user_attr("scaled_estimate_ms", scaled)
        trial.set_user_attr("best_at_start_ms", best)
        if scaled > self.margin * best:
            trial.set_user_attr("screen", "estimate")
            raise optuna.TrialPruned(
                f"estimate {scaled:.1f} ms (rescaled x{scale:.3g}) exceeds {self.margin:g} x the "
                f"best measured {best:.1f} ms"
            )


def _plan(trial: optuna.trial.FrozenTrial) -> Any:
    from lightning_embark.plan import Plan

    return Plan.from_dict(trial.user_attrs["plan"])


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)
