"""Fixtures shared with the baseline's tests: launching the torchrec scripts there."""

from __future__ import annotations

from pathlib import Path

from lightning_embark.testing import load_module

_baseline = load_module(
    Path(__file__).resolve().parents[1] / "baseline" / "conftest.py", "_embark_baseline_fixtures"
)
run_torchrun = _baseline.run_torchrun
run_lightning = _baseline.run_lightning
