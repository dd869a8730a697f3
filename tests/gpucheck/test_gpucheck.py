"""``python -m lightning_embark.gpucheck --device cpu``: the GPU check's own run, small, on
CPU ranks over gloo with the kernels in Triton's interpreter; and its comparison fails
on a wrong result."""

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
from lightning_embark.gpucheck._check import compare
from lightning_embark.gpucheck._scenario import TABLES, build, oracle


def test_the_cpu_run_passes_and_writes_its_report(tmp_path: Path) -> None:
    out = tmp_path / "gpucheck.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "lightning_embark.gpucheck",
            "--device",
            "cpu",
            "--worlds",
            "1,2",
            "--batch",
            "16",
            "--timing-batch",
            "8",
            "--steps",
            "1",
            "--warmup",
            "0",
            "--kernel-cases",
            "2",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env=os.environ | {"TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["ok"] is True
    assert report["kernels"]["cases"] > 0
    assert report["kernels"]["bit_identical"] == report["kernels"]["cases"]
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
    assert "PASSED" in done.stdout and "| 2 | h16 | rb16 | fp16/bf16 |" in done.stdout


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
        CheckConfig(device="cuda", kernel="fbgemm")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="torch sees no GPU; use --device cpu"):
            CheckConfig(device="cuda")
