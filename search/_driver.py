"""``tune()``: run a study on the emulated cluster, restarting the ranks after a crash or hang.

The ranks start once (:mod:`._ranks`, torchrun per emulated host) and take plan after
plan. When they exit non-zero (a rank crashed, or rank 0's watchdog stopped a hung
trial), every process and the emulated network's leftovers are cleaned up by the
launcher, each trial the dead ranks left running is marked failed with the ranks' own
reasons (``fault_reason``; Optuna stores none by itself), and the ranks start again on
the same storage, which resumes the study.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import optuna

from lightning_embark.errors import EmbarkError
from lightning_embark.search._config import TuneConfig
from lightning_embark.search._ranks import FAULT_GLOB, RESULT_FILE, TIMEOUT_EXIT, fault_reasons
from lightning_embark.search._result import TuneResult
from lightning_embark.search._storage import open_storage
from lightning_embark.search._workload import greedy_plan


def fail_running_trials(config: TuneConfig, code: int) -> list[int]:
    """Mark the trials the dead ranks left running as failed, with their reasons."""
    reasons = fault_reasons(config.run_dir, config.num_hosts * config.ranks_per_host)
    if not reasons:
        reasons = [
            f"the ranks exited with status {code}"
            + (" (trial time limit)" if code == TIMEOUT_EXIT else "")
        ]
    storage = open_storage(config.storage, heartbeat=False)
    study = optuna.load_study(study_name=config.study_name, storage=storage)
    failed = []
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        storage.set_trial_user_attr(trial._trial_id, "fail_reason", "; ".join(reasons))
        study.tell(trial.number, state=optuna.trial.TrialState.FAIL)
        failed.append(trial.number)
    return failed


def check_before_launch(config: TuneConfig) -> None:
    """Errors a user can fix, before any rank starts: the storage, the greedy plan."""
    open_storage(config.storage, heartbeat=False)
    greedy_plan(config)


def tune(config: TuneConfig) -> TuneResult:
    """Run the study of ``config`` on an emulated cluster and return its result.

    Raises:
        EmbarkError: the ranks failed more than ``config.max_restarts`` times.
        ConfigError: bad input, found before launching.
    """
    from lightning_embark.emulation import QUIET_RANK_ENV, EmulatedHosts, EmulationConfig

    check_before_launch(config)
    run_dir = config.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / RESULT_FILE).unlink(missing_ok=True)
    config_file = run_dir / "config.json"
    config_file.write_text(json.dumps(config.to_dict(), indent=2))
    link: dict[str, Any] = {"rate_mbit": config.rate_mbit} if config.rate_mbit is not None else {}
    emulation = EmulationConfig(
        num_hosts=config.num_hosts,
        ranks_per_host=config.ranks_per_host,
        delay_ms=config.delay_ms,
        **link,
    )
    argv = ["-m", "lightning_embark.search", str(config_file.resolve())]
    world = config.num_hosts * config.ranks_per_host
    with EmulatedHosts(emulation, force_loopback=config.loopback) as cluster:
        print(f"[embark-tune] {cluster.describe()}", file=sys.stderr, flush=True)
        for attempt in range(config.max_restarts + 1):
            for stale in run_dir.glob(FAULT_GLOB):
                stale.unlink()
            code = cluster.run(argv, env=QUIET_RANK_ENV, log_prefix=False)
            if code == 0:
                break
            failed = fail_running_trials(config, code)
            reasons = "; ".join(fault_reasons(run_dir, world)) or f"status {code}"
            print(
                f"[embark-tune] ranks exited ({reasons}); failed trials {failed}; restart "
                f"{attempt + 1}/{config.max_restarts}",
                file=sys.stderr,
                flush=True,
            )
        else:
            raise EmbarkError(
                f"the ranks failed {config.max_restarts + 1} times; the last: "
                f"{'; '.join(fault_reasons(run_dir, world)) or f'status {code}'}. The study in "
                f"{config.storage!r} keeps every finished trial: fix the cause and run again"
            )
    result_path = Path(run_dir / RESULT_FILE)
    if not result_path.exists():
        raise EmbarkError(f"the ranks exited cleanly but wrote no {result_path}")
    return TuneResult.from_dict(json.loads(result_path.read_text()))
