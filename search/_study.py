"""Rank 0's study: create or resume it, enqueue the greedy plan, search, re-measure.

The study is the record: every trial's parameters, plan, estimate and measured steps
live in its storage, so a restart (after a crash, a hang or a kill) resumes from it:
``--trials`` counts the trials the study holds, finished ones included, and the
search-phase time budget runs from the study's first start.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import optuna

from lightning_embark.errors import ConfigError
from lightning_embark.plan import Plan
from lightning_embark.search._config import TuneConfig
from lightning_embark.search._objective import Objective, measured_trials
from lightning_embark.search._paired import PairedResult, paired_remeasure
from lightning_embark.search._ranks import lead_run
from lightning_embark.search._space import plan_key
from lightning_embark.search._storage import experimental_chosen, open_storage
from lightning_embark.search._workload import cost_model, space_for

FINISHED = (
    optuna.trial.TrialState.COMPLETE,
    optuna.trial.TrialState.PRUNED,
    optuna.trial.TrialState.FAIL,
)


def make_pruner(name: str, warmup: int) -> optuna.pruners.BasePruner:
    """``wilcoxon``: every trial replays the same batches, so step ``i`` of two trials is a
    paired sample; ``median``: stop below the median of earlier trials after ``warmup``
    steps; ``none``."""
    if name == "wilcoxon":
        with experimental_chosen():
            return optuna.pruners.WilcoxonPruner(p_threshold=0.1, n_startup_steps=max(2, warmup))
    if name == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=1, n_warmup_steps=max(1, warmup))
    return optuna.pruners.NopPruner()


def open_study(config: TuneConfig) -> optuna.Study:
    """Create the study, or load it (``load_if_exists``) when the storage has it."""
    storage = open_storage(config.storage)
    # A restarted study must not replay its sampler's first draws: the seed moves on with
    # the trials the storage already holds (deterministic for a given history).
    existing = 0
    if config.study_name in optuna.study.get_all_study_names(storage):
        existing = len(optuna.load_study(study_name=config.study_name, storage=storage).trials)
    return optuna.create_study(
        storage=storage,
        study_name=config.study_name,
        direction="minimize",
        load_if_exists=True,
        sampler=optuna.samplers.TPESampler(seed=config.seed + existing, n_startup_trials=5),
        pruner=make_pruner(config.pruner, config.warmup),
    )


def check_same_study(study: optuna.Study, config: TuneConfig) -> None:
    """A resumed study must tune the same workload, or its trials compare nothing."""
    stored = study.user_attrs.get("config")
    if stored is None:
        study.set_user_attr("config", config.to_dict())
        study.set_user_attr("search_started", time.time())
        return
    keys = (
        *("model", "max_rows", "num_hosts", "ranks_per_host", "batch_size", "steps", "warmup"),
        *("seed", "interaction", "dense_arch", "over_arch", "topology", "allow"),
    )
    differ = {
        k: (stored.get(k), v)
        for k, v in config.to_dict().items()
        if k in keys and stored.get(k) != (list(v) if isinstance(v, tuple) else v)
    }
    if differ:
        raise ConfigError(
            f"study {config.study_name!r} in {config.storage!r} tunes another workload "
            f"(stored vs given: {differ}); pass another --study-name or --storage"
        )


def _progress(config: TuneConfig) -> Any:
    def report(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        done = len(study.get_trials(deepcopy=False, states=FINISHED))
        value = trial.user_attrs.get("measured_ms")
        shown = f"{value:.1f} ms" if value is not None else trial.state.name.lower()
        why = trial.user_attrs.get("screen") or trial.user_attrs.get("fail_reason") or ""
        best = min((t.user_attrs["measured_ms"] for t in measured_trials(study)), default=None)
        best_text = f", best {best:.1f} ms" if best is not None else ""
        print(
            f"[embark-tune] trial {trial.number} ({done}/{config.trials}): {shown}"
            f"{f' ({why})' if why else ''}{best_text}",
            file=sys.stderr,
            flush=True,
        )

    return report


def search(config: TuneConfig, study: optuna.Study) -> None:
    """Run trials until the study holds ``config.trials`` or the time budget is spent."""
    model = cost_model(config)
    space = space_for(config, model)
    greedy = space.greedy_params()
    if not study.trials:
        study.enqueue_trial(greedy, user_attrs={"greedy": True})
    objective = Objective(
        space=space,
        model=model,
        run=lambda plan, trial, on_step: lead_run(
            config, plan, trial=trial, on_step=on_step, what=f"trial {trial.number}"
        ),
        margin=config.screen_margin,
        memory_per_rank=model.calib.memory_per_rank,
    )
    remaining = config.trials - len(study.get_trials(deepcopy=False, states=FINISHED))
    timeout = None
    if config.timeout_s is not None:
        timeout = config.timeout_s - (time.time() - study.user_attrs["search_started"])
    if remaining <= 0 or (timeout is not None and timeout <= 0):
        return
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study.optimize(
        objective,
        n_trials=remaining,
        timeout=timeout,
        callbacks=[_progress(config)],
        gc_after_trial=False,
    )


def top_candidates(study: optuna.Study, k: int) -> list[optuna.trial.FrozenTrial]:
    """The ``k`` fastest measured trials with distinct plans, the greedy plan's excluded."""
    greedy = next((t for t in study.trials if t.user_attrs.get("greedy")), None)
    seen = {plan_key(Plan.from_dict(greedy.user_attrs["plan"]))} if greedy else set()
    chosen = []
    for t in sorted(measured_trials(study), key=lambda t: t.user_attrs["measured_ms"]):
        key = plan_key(Plan.from_dict(t.user_attrs["plan"]))
        if key not in seen:
            seen.add(key)
            chosen.append(t)
    return chosen[:k]


def remeasure(config: TuneConfig, study: optuna.Study) -> PairedResult | None:
    """The paired re-measurement of :mod:`._paired` (stored in the study: a restart after
    it does not repeat it). None when no candidate differs from the greedy plan."""
    if "paired" in study.user_attrs:
        return PairedResult.from_dict(study.user_attrs["paired"])
    greedy = next((t for t in study.trials if t.user_attrs.get("greedy")), None)
    if greedy is None or "plan" not in greedy.user_attrs:
        raise ConfigError("the greedy trial was never measured; the study cannot be judged")
    candidates = {str(t.number): t.user_attrs["plan"] for t in top_candidates(study, config.top_k)}
    if not candidates:
        return None
    plans = {"greedy": greedy.user_attrs["plan"], **candidates}

    def measure(label: str) -> float:
        measured = lead_run(config, plans[label], trial=None, on_step=None, what=f"re-run {label}")
        return measured.median

    def progress(label: str, round_: int, seconds: float) -> None:
        print(
            f"[embark-tune] paired round {round_ + 1}/{config.pairs}: "
            f"{'greedy' if label == 'greedy' else 'trial ' + label} {1e3 * seconds:.1f} ms",
            file=sys.stderr,
            flush=True,
        )

    result = paired_remeasure(measure, list(candidates), pairs=config.pairs, on_run=progress)
    study.set_user_attr("paired", result.to_dict())
    return result
