"""``python -m lightning_embark.gpucheck --device cpu``: the GPU check's documented CPU run,
its defaults and no environment of ours (the check puts its CPU ranks' kernels in
Triton's interpreter itself); and its comparison fails on a wrong result."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lightning_embark.errors import ConfigError
from lightning_embark.gpucheck import CheckConfig
from lightning_embark.gpucheck._check import DEFAULTS, INTERPRET_ENV, compare, kernel_environment
from lightning_embark.gpucheck._scenario import TABLES, build, oracle


def test_the_documented_cpu_run_passes_and_writes_its_report(tmp_path: Path) -> None:
    """The command as the README gives it, run as a user would: the suite's
    ``TRITON_INTERPRET`` is not passed on (the default CPU run takes ~25 s of CPU)."""
    out = tmp_path / "gpucheck.json"
    env = {k: v for k, v in os.environ.items() if k != INTERPRET_ENV}
    done = subprocess.run(
        [sys.executable, "-m", "lightning_embark.gpucheck", "--device", "cpu", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["ok"] is True
    assert report["config"]["kernel_cases"] == DEFAULTS["cpu"]["kernel_cases"]
    assert report["kernels"]["cases"] == 4 * DEFAULTS["cpu"]["kernel_cases"]
    assert report["kernels"]["bit_identical"] == report["kernels"]["cases"]
    assert "Triton interpreter" in report["environment"]["kernel_mode"]
    assert report["overlap"] == [
        {"world": 1, "bit_identical": True},
        {"world": 2, "bit_identical": True},
    ]
    assert {(r["world"], r["table"]) for r in report["engine"]} == {
        (w, t) for w in (1, 2) for t in TABLES
    }
    assert {(r["world"], r["cluster"]) for r in report["timings"]} == {
        (w, c) for w in (1, 2) for c in ("dp", "rb", "ub")
    }
    assert all(r["fused_ms"] > 0 and r["unfused_ms"] > 0 for r in report["timings"])
    # What a GPU would see of a step, for every rank of every world.
    assert [(r["world"], r["rank"]) for r in report["counts"]] == [(1, 0), (2, 0), (2, 1)]
    assert all(sum(r["collectives"].values()) > 0 for r in report["counts"])
    assert "PASSED" in done.stdout and "| 2 | h16 | rb16 | fp16/bf16 |" in done.stdout
    assert "Triton interpreter" in done.stdout.splitlines()[1]  # the kernels' line says so
    assert "| world | rank | ATen ops | would sync (counted) |" in done.stdout
    assert "world 2, rank 0, one step: " in done.stdout


def test_the_ranks_start_in_the_kernels_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(INTERPRET_ENV, "0")
    with kernel_environment("cpu"):
        assert os.environ[INTERPRET_ENV] == "1"
    assert os.environ[INTERPRET_ENV] == "0"
    with kernel_environment("cuda"):  # compiled kernels, whatever the caller set
        assert INTERPRET_ENV not in os.environ
    assert os.environ[INTERPRET_ENV] == "0"


def test_sizes_default_per_device() -> None:
    config = CheckConfig(device="cpu", steps=7)
    assert config.steps == 7
    assert (
        config.timing_batch == DEFAULTS["cpu"]["timing_batch"] < DEFAULTS["cuda"]["timing_batch"]
    )


def _rank_results(world: int, scenario, truth) -> list[dict]:
    """What the ranks would report if the engine computed the oracle's result exactly:
    the oracle's outputs split by rank, every table whole on rank 0."""
    batch = scenario.batches[0][scenario.tables[0].feature_names[0]].lengths.numel()
    out = truth.pooled.to(torch.float32)
    shards = [
        (t.name, torch.arange(t.num_embeddings), 0, t.embedding_dim, truth.tables[t.name])
        for t in scenario.tables
    ]
    return [
        {"exact": {"out": out[r * batch : (r + 1) * batch], "shards": shards if r == 0 else []}}
        for r in range(world)
    ]


def test_the_comparison_passes_the_oracle_and_fails_a_wrong_row() -> None:
    scenario = build(2, batch=8)
    truth = oracle(scenario)
    ranks = _rank_results(2, scenario, truth)
    assert all(row["ok"] for row in compare(scenario, truth, ranks))
    ranks[1]["exact"]["out"][3, 0] += 0.01  # table dp's first column, one sample
    rows = {row["table"]: row for row in compare(scenario, truth, ranks)}
    assert not rows["dp"]["ok"] and rows["dp"]["output_error_over_bound"] > 1
    assert all(rows[t]["ok"] for t in TABLES if t != "dp")


def test_bad_options_are_named() -> None:
    with pytest.raises(ConfigError, match="--device must be cuda or cpu"):
        CheckConfig(device="mps")
    with pytest.raises(ConfigError, match="--worlds must be positive"):
        CheckConfig(device="cpu", worlds=(0,))
    with pytest.raises(ConfigError, match="fbgemm's CPU kernels only"):
        CheckConfig(device="cuda", store="fbgemm")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="torch sees no GPU; use --device cpu"):
            CheckConfig(device="cuda")
