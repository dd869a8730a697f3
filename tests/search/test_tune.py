"""Whole studies on two ranks with a tiny model: faults, kill and resume, the plan file.

The faults' study runs on the emulated cluster (as a user's study does); the others on
loopback: they check the study's bookkeeping, not the network, and loopback needs no root.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from lightning_embark.plan import Plan
from lightning_embark.search import FAULT_ENV, TuneConfig, TuneResult, load_study, tune
from lightning_embark.search._storage import GRACE_PERIOD_S

pytestmark = pytest.mark.multiprocess

_TINY = dict(
    model="demo-small",
    max_rows=2000,
    num_hosts=2,
    ranks_per_host=1,
    batch_size=32,
    steps=3,
    warmup=1,
    interaction="dot",
    dense_arch="16",
    over_arch="16,1",
    allow=("fp16",),
    loopback=True,
    pairs=2,
    top_k=1,
    pruner="none",
)


def _config(tmp_path: Path, **changes: object) -> TuneConfig:
    fields = _TINY | {
        "storage": f"sqlite:///{tmp_path / 'study.db'}",
        "out": str(tmp_path / "best-plan.json"),
        "trials": 3,
    }
    return TuneConfig(**(fields | changes))  # type: ignore[arg-type]


def test_a_crash_a_hang_and_a_kill_fail_their_trials_with_reasons_and_the_study_completes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the emulated cluster (2 hosts of 1 rank; loopback where namespaces are not
    available): trial 1 crashes on the last rank; trial 2 hangs there past the 20 s limit;
    trial 3 loses that rank to SIGKILL mid-training. Each is failed with its reason (the
    killed rank's: its survivor's PeerError naming it, and the hint that a signal killed
    it), the ranks restart, and the study finishes its trials and the re-measurement; the
    best plan file loads in the strategy."""
    from lightning_embark.strategies import EmbarkStrategy

    config = _config(tmp_path, trials=5, trial_timeout_s=20.0, loopback=False)
    monkeypatch.setenv(FAULT_ENV, "crash:1")
    # One fault per launch: each restart runs the next trial, with the next fault.
    later = iter(["hang:2", "kill:3", ""])
    import lightning_embark.search._driver as driver

    original = driver.fail_running_trials

    def switch_fault(cfg: TuneConfig, code: int) -> list[int]:
        os.environ[FAULT_ENV] = next(later)
        return original(cfg, code)

    monkeypatch.setattr(driver, "fail_running_trials", switch_fault)
    started = time.monotonic()
    result = tune(config)
    print(f"study with three faults: {time.monotonic() - started:.1f} s")
    study = load_study(config.storage, config.study_name)
    states = {t.number: t.state for t in study.trials}
    assert states[0] is optuna.trial.TrialState.COMPLETE
    assert [states[n] for n in (1, 2, 3)] == [optuna.trial.TrialState.FAIL] * 3
    assert "injected crash in trial 1" in study.trials[1].user_attrs["fail_reason"]
    assert "exceeded the trial time limit of 20 s" in study.trials[2].user_attrs["fail_reason"]
    killed = study.trials[3].user_attrs["fail_reason"]
    assert "PeerError" in killed and "rank 1 on host 1" in killed, killed
    assert "ranks [1] wrote no reason: killed by a signal" in killed, killed
    assert len(study.trials) >= 5
    assert study.trials[-1].state is not optuna.trial.TrialState.RUNNING
    assert result.greedy_ms is not None and result.greedy_ms > 0
    plan = Plan.load(config.out)
    assert EmbarkStrategy(plan=config.out).plan == plan == result.plan
    assert TuneResult.from_dict(result.to_dict()) == result
    winner = result.winner
    expected = study.trials[winner] if winner is not None else study.trials[0]
    assert plan.to_dict() == expected.user_attrs["plan"]


def test_killing_embark_tune_and_starting_again_keeps_every_completed_trial(
    tmp_path: Path,
) -> None:
    """SIGKILL the launcher after its first completed trial; a second run with the same
    storage resumes: the completed trials keep their values, the trial that was running
    is failed once its heartbeat is stale, and the study reaches its trial count."""
    config = _config(tmp_path, trials=4)
    argv = [
        sys.executable,
        "-m",
        "lightning_embark.cli.embark_tune",
        *("--model", "demo-small", "--max-rows", "2000", "--hosts", "2"),
        *("--ranks-per-host", "1", "--batch-size", "32", "--steps", "3", "--warmup", "1"),
        *("--interaction", "dot", "--dense-arch", "16", "--over-arch", "16,1"),
        *("--allow", "fp16", "--loopback", "--pairs", "2", "--top-k", "1"),
        *("--pruner", "none", "--trials", "4", "--storage", config.storage),
        *("--out", config.out),
    ]
    first = subprocess.Popen(argv, start_new_session=True, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    completed: dict[int, float] = {}
    try:
        while time.monotonic() < deadline and not completed:
            time.sleep(1.0)
            if first.poll() is not None:
                pytest.fail("embark-tune finished before it could be killed")
            try:
                study = load_study(config.storage, config.study_name)
            except Exception:  # the storage is created by rank 0 a few seconds in
                continue
            completed = {
                t.number: t.value
                for t in study.trials
                if t.state is optuna.trial.TrialState.COMPLETE and t.value is not None
            }
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    assert completed, "no trial completed within the deadline"
    time.sleep(GRACE_PERIOD_S + 1)  # the trial the kill interrupted now has a stale heartbeat
    second = subprocess.run(argv, capture_output=True, text=True, timeout=400)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    study = load_study(config.storage, config.study_name)
    for number, value in completed.items():
        assert study.trials[number].state is optuna.trial.TrialState.COMPLETE
        assert study.trials[number].value == value
    finished = [t for t in study.trials if t.state.is_finished()]
    assert len(finished) >= 4
    assert not [t for t in study.trials if t.state is optuna.trial.TrialState.RUNNING]
    assert json.loads(Path(config.out).read_text())["world_size"] == 2
