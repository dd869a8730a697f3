"""Fixtures shared with the emulation's tests: job scripts and the leftover-namespace guard."""

from __future__ import annotations

from pathlib import Path

from lightning_embark.testing import load_module

_emulation = load_module(
    Path(__file__).resolve().parents[1] / "emulation" / "conftest.py", "_embark_emulation_fixtures"
)
prefix = _emulation.prefix
gloo_job = _emulation.gloo_job
sleep_job = _emulation.sleep_job
no_leftover_namespaces = _emulation.no_leftover_namespaces
