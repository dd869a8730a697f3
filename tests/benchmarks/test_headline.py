"""``benchmarks/headline.py`` and its command line (``benchmarks/_headline/cli.py``): the
``KEY=VALUE`` options, and the whole command with a fake runner in place of the emulated
cluster (no torchrun, no namespaces)."""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from lightning_embark.testing._ranks import load_module

REPO = Path(__file__).resolve().parents[2]
headline = load_module(REPO / "benchmarks" / "headline.py", "headline_under_test")
cli = importlib.import_module("_headline.cli")
headline_paired = importlib.import_module("_headline.paired")
headline_pilot = importlib.import_module("_headline.pilot")
headline_workloads = importlib.import_module("_headline.workloads")


def test_parse_overrides() -> None:
    assert cli.parse_overrides(["t180=120", "t200=2.5"], ["t180", "t200"], "x") == {
        "t180": 120.0,
        "t200": 2.5,
    }
    for bad in (["t9=1"], ["t180"], ["t180=fast"], ["t180=0"]):
        with pytest.raises(ValueError):
            cli.parse_overrides(bad, ["t180"], "--rate-mbit")


def test_whole_command_with_a_fake_runner(
    tmp_path: Path, headline_run: Callable[..., dict[str, Any]]
) -> None:
    calls: list[tuple[str, float | None, int | None]] = []

    def fake(workload: Any, model: str, label: str, *, rate_mbit, settings, **kw) -> dict:
        calls.append((label, rate_mbit, kw.get("steps")))
        pilot = kw.get("steps") is not None
        step = {"torchrec-twrw": 200.0, "torchrec-fp16": 160.0}.get(label, 100.0)
        run = headline_run(step, share=0.1 if pilot else 0.35)
        return run | {"strategy": label, "rate_mbit": rate_mbit}

    out = tmp_path / "out"
    code = headline.main(
        ["--out-dir", str(out), "--models", "t200", "--repeats", "2", "--no-estimates"],
        runner=fake,
    )
    assert code == 0
    rate = headline_pilot.pilot_rate(800, 0.1)
    assert calls[0] == ("torchrec-twrw", 800.0, 5)  # the pilot at the start rate
    labels = list(headline_workloads.STRATEGY_RUNS)
    assert [c[0] for c in calls[1:]] == labels + headline_paired.rotated(labels, 1)
    assert all(r == pytest.approx(rate) for _, r, _ in calls[1:])
    doc = json.loads((out / "headline.json").read_text())
    (w,) = doc["workloads"]
    assert w["pilot"]["share"] == 0.1 and w["rate_mbit"] == pytest.approx(rate)
    assert w["summary"]["embark"]["ratio"]["torchrec-fp16"]["median"] == pytest.approx(0.625)
    md = (out / "headline.md").read_text()
    row = "| T200 | 148.1 | embark-compressed | 100.0 | 100.0-100.0 | 0.50 | 0.62 | 35% | 2.00 |"
    assert f"{row} 3.00 | fp32 flat |" in md
    assert (out / "headline.png").stat().st_size > 0


def test_rate_override_skips_the_pilot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, headline_run: Callable[..., dict[str, Any]]
) -> None:
    monkeypatch.setattr(cli, "plot_headline", lambda *args: None)  # drawn above already
    rates: list[float | None] = []

    def fake(workload: Any, model: str, label: str, *, rate_mbit, settings, **kw) -> dict:
        rates.append(rate_mbit)
        return headline_run(100.0) | {"strategy": label, "rate_mbit": rate_mbit}

    argv = ["--out-dir", str(tmp_path), "--models", "t510", "--repeats", "1", "--no-estimates"]
    argv += ["--rate-mbit", "t510=50", "--strategies", "torchrec-twrw,embark"]
    assert headline.main(argv, runner=fake) == 0
    assert rates == [50.0, 50.0]
    with pytest.raises(SystemExit):
        headline.main([*argv, "--rate-mbit", "t999=5"], runner=fake)
