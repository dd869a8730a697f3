"""The study's outcome: the table, the verdict, the best plan file, plots, and the screen's record.

The best plan is the paired re-measurement's winner, or the greedy plan when no candidate
was shown faster (never the single fastest trial: see :mod:`._paired`). It is written as
a plan file (``EmbarkStrategy(plan=...)``, ``embark-bench --plan``, ``embark-plan --plan``
read it) and uploaded to the study as an Optuna artifact.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import optuna

from lightning_embark.plan import Plan
from lightning_embark.search._config import TuneConfig
from lightning_embark.search._objective import measured_trials
from lightning_embark.search._paired import PairedResult
from lightning_embark.search._result import TuneResult
from lightning_embark.search._space import differing_params
from lightning_embark.search._workload import cost_model, space_for


def _note(trial: optuna.trial.FrozenTrial) -> str:
    attrs = trial.user_attrs
    if "fail_reason" in attrs:
        return str(attrs["fail_reason"])
    if attrs.get("screen") == "memory":
        return f"does not fit: {attrs.get('reason', '')}"
    if attrs.get("screen") == "estimate":
        return f"screened: estimate {attrs['scaled_estimate_ms']:.1f} ms rescaled"
    if "cached_from" in attrs:
        return f"same plan as trial {attrs['cached_from']}"
    if "pruned_at_step" in attrs:
        return f"pruned after {attrs['pruned_at_step']} steps"
    return "greedy plan" if attrs.get("greedy") else ""


def trial_rows(study: optuna.Study, greedy: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for t in study.trials:
        attrs = t.user_attrs
        rows.append(
            {
                "number": t.number,
                "state": t.state.name,
                "params": differing_params(t.params, greedy),
                "predicted_ms": attrs.get("predicted_ms"),
                "measured_ms": attrs.get("measured_ms"),
                "p10_ms": attrs.get("p10_ms"),
                "p90_ms": attrs.get("p90_ms"),
                "note": _note(t),
            }
        )
    return rows


def screen_record(study: optuna.Study, margin: float) -> dict[str, Any]:
    """How the cost-model screen did: what it stopped, and whether what it let through
    was worth running (measured within ``margin`` of the best at that moment)."""
    trials = study.trials
    let_through = [
        t for t in measured_trials(study) if "best_at_start_ms" in t.user_attrs
    ]  # trials measured while the screen was active
    worth = [
        t
        for t in let_through
        if t.user_attrs["measured_ms"] <= margin * t.user_attrs["best_at_start_ms"]
    ]
    return {
        "margin": margin,
        "pruned_by_estimate": sum(t.user_attrs.get("screen") == "estimate" for t in trials),
        "infeasible": sum(t.user_attrs.get("screen") == "memory" for t in trials),
        "let_through": len(let_through),
        "let_through_within_margin": len(worth),
    }


def rank_correlation(study: optuna.Study) -> float | None:
    """Spearman correlation of estimated and measured steps over the measured trials."""
    from lightning_embark.calibration import spearman

    points = [
        (t.user_attrs["predicted_ms"], t.user_attrs["measured_ms"]) for t in measured_trials(study)
    ]
    if len(points) < 3:
        return None
    return float(spearman([p for p, _ in points], [m for _, m in points]))


def plot_study(study: optuna.Study, folder: Path, greedy_ms: float) -> list[str]:
    """Three PNGs: optimization history with the greedy line, parameter importances, and
    estimated vs measured step per trial."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    measured = sorted(measured_trials(study), key=lambda t: t.number)
    paths = []
    fig, ax = plt.subplots(figsize=(7, 4))
    xs = [t.number for t in measured]
    ys = [t.user_attrs["measured_ms"] for t in measured]
    best, running = [], float("inf")
    for y in ys:
        running = min(running, y)
        best.append(running)
    ax.scatter(xs, ys, s=18, label="measured median step")
    ax.step(xs, best, where="post", color="C2", label="best so far")
    ax.axhline(greedy_ms, color="C3", linestyle="--", label="greedy plan")
    ax.set_xlabel("trial")
    ax.set_ylabel("step (ms)")
    ax.set_title("embark-tune: optimization history")
    ax.legend()
    fig.tight_layout()
    paths.append(str(folder / "history.png"))
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    complete = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    if len(complete) >= 2 and len({json.dumps(t.params, sort_keys=True) for t in complete}) >= 2:
        importances = optuna.importance.get_param_importances(study)
        fig, ax = plt.subplots(figsize=(7, 0.4 * max(3, len(importances)) + 1))
        names = list(importances)[::-1]
        ax.barh(names, [importances[n] for n in names])
        ax.set_xlabel("importance (fANOVA)")
        ax.set_title("embark-tune: parameter importances")
        fig.tight_layout()
        paths.append(str(folder / "importances.png"))
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)

    fig, ax = plt.subplots(figsize=(5, 5))
    ax.scatter([t.user_attrs["predicted_ms"] for t in measured], ys, s=18)
    for t, y in zip(measured, ys, strict=True):
        ax.annotate(str(t.number), (t.user_attrs["predicted_ms"], y), fontsize=7)
    ax.set_xlabel("estimated step (ms, cost model)")
    ax.set_ylabel("measured median step (ms)")
    ax.set_title("embark-tune: estimated vs measured")
    fig.tight_layout()
    paths.append(str(folder / "predicted_vs_measured.png"))
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths


def finish(config: TuneConfig, study: optuna.Study, paired: PairedResult | None) -> TuneResult:
    """Write the best plan, upload it, plot, and return the result (rank 0)."""
    model = cost_model(config)
    space = space_for(config, model)
    greedy_trial = next(t for t in study.trials if t.user_attrs.get("greedy"))
    winner = paired.winner if paired is not None else None
    chosen = study.trials[int(winner)] if winner is not None else greedy_trial
    plan = Plan.from_dict(chosen.user_attrs["plan"])
    out = Path(config.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    plan.save(out)
    from optuna.artifacts import FileSystemArtifactStore, upload_artifact

    store = FileSystemArtifactStore(config.run_dir / "artifacts")
    (config.run_dir / "artifacts").mkdir(parents=True, exist_ok=True)
    artifact = upload_artifact(artifact_store=store, file_path=str(out), study_or_trial=study)
    candidate = (
        next(c for c in paired.candidates if c.name == winner) if paired and winner else None
    )
    plots: tuple[str, ...] = ()
    if config.plots:
        plots = tuple(
            plot_study(study, Path(config.plots), greedy_trial.user_attrs.get("measured_ms", 0.0))
        )
    return TuneResult(
        storage=config.storage,
        study_name=config.study_name,
        artifact_id=artifact,
        greedy_trial=greedy_trial.number,
        greedy_ms=greedy_trial.user_attrs.get("measured_ms"),
        greedy_predicted_ms=greedy_trial.user_attrs.get("predicted_ms"),
        trials=tuple(trial_rows(study, space.greedy_params())),
        paired=paired,
        winner=int(winner) if winner is not None else None,
        gain=(1 - candidate.median) if candidate is not None else None,
        screen=screen_record(study, config.screen_margin),
        rank_correlation=rank_correlation(study),
        best_plan=out,
        plots=plots,
    )
