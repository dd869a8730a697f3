"""Opening the study's storage: SQLite by default, any Optuna URL, or a journal file.

RDB storages (``sqlite:///``, ``postgresql://``, ...) get heartbeats: a trial whose
process died stops beating, and the next trial of any worker on the study marks it
failed (``grace_period``) and enqueues it once more (``RetryHeartbeatStaleTrialCallback``),
so killing ``embark-tune`` and starting it again loses no completed trial and leaves no
trial running forever. Journal files have no heartbeats; there the launcher marks the
trials its dead ranks left running (see :mod:`._driver`).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import optuna

from lightning_embark.errors import ConfigError

HEARTBEAT_INTERVAL_S = 5
GRACE_PERIOD_S = 20
JOURNAL_SUFFIXES = (".log", ".journal", ".jsonl")


@contextmanager
def experimental_chosen() -> Iterator[None]:
    """Optuna warns at every use of an experimental feature (heartbeats, the stale-trial
    retry, the Wilcoxon pruner); the study uses them by design, so the warning says
    nothing to its user. Silenced inside the block only."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        yield


def is_journal(storage: str) -> bool:
    """Whether ``storage`` names a journal file rather than a database URL."""
    return "://" not in storage and Path(storage).suffix in JOURNAL_SUFFIXES


def open_storage(storage: str, *, heartbeat: bool = True) -> Any:
    """An Optuna storage for ``storage``.

    Raises:
        ConfigError: neither a URL (``scheme://...``) nor a journal file path.
    """
    if is_journal(storage):
        from optuna.storages.journal import JournalFileBackend

        Path(storage).parent.mkdir(parents=True, exist_ok=True)
        return optuna.storages.JournalStorage(JournalFileBackend(storage))
    if "://" not in storage:
        raise ConfigError(
            f"storage {storage!r} is neither a storage URL (e.g. sqlite:///embark-tune.db) nor "
            f"a journal file ({', '.join(JOURNAL_SUFFIXES)})"
        )
    if not heartbeat:
        return optuna.storages.RDBStorage(storage)
    with experimental_chosen():
        return optuna.storages.RDBStorage(
            storage,
            heartbeat_interval=HEARTBEAT_INTERVAL_S,
            grace_period=GRACE_PERIOD_S,
            heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(
                max_retry=1
            ),
        )


def load_study(storage: str, study_name: str, *, heartbeat: bool = False) -> optuna.Study:
    """An existing study (for reports and ``embark-calibrate --from-study``).

    Raises:
        ConfigError: the storage holds no study of that name; names those it holds.
    """
    opened = open_storage(storage, heartbeat=heartbeat)
    names = optuna.study.get_all_study_names(opened)
    if study_name not in names:
        raise ConfigError(
            f"storage {storage!r} has no study {study_name!r}; it has {names or 'none'} "
            "(pass --study-name)"
        )
    return optuna.load_study(study_name=study_name, storage=opened)


def study_points(storage: str, study_name: str) -> tuple[dict[str, Any], list[Any]]:
    """A finished study's configuration and its measured trials as calibration points
    (:class:`~lightning_embark.calibration.StudyPoint`; cached and screened trials
    carry no measurement of their own and are left out).

    Raises:
        ConfigError: no such study, or one ``embark-tune`` did not write.
    """
    from lightning_embark.calibration import StudyPoint

    study = load_study(storage, study_name)
    config = study.user_attrs.get("config")
    if config is None:
        raise ConfigError(
            f"study {study_name!r} in {storage!r} was not written by embark-tune (it has no "
            "stored configuration)"
        )
    points = [
        StudyPoint(
            number=t.number,
            plan=t.user_attrs["plan"],
            predicted=t.user_attrs["predicted"],
            measured_ms=t.user_attrs["measured_ms"],
        )
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        if "measured_ms" in t.user_attrs and "cached_from" not in t.user_attrs
    ]
    return config, points
