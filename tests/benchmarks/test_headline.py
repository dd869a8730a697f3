"""``benchmarks/headline.py`` and its command line (``benchmarks/_headline/cli.py``): the
``KEY=VALUE`` options, and the whole command with a fake runner in place of the emulated
cluster (no torchrun, no namespaces): the pilot on the reference, every run a shaped /
unshaped pair in rotated, alternating order, and the report's ratios, intervals and
verdicts."""

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
paired = importlib.import_module("_headline.paired")
workloads = importlib.import_module("_headline.workloads")

LABELS = list(workloads.STRATEGY_RUNS)
#: The fake's shaped steps (ms) per label; unshaped: 0.6 of it (embark: 0.7, its CPU cost).
STEPS = {"torchrec": 200.0, "torchrec-fp16": 160.0, "torchrec-twrw": 250.0}


def test_parse_overrides() -> None:
    assert cli.parse_overrides(["t180=120", "t200=2.5"], ["t180", "t200"], "x") == {
        "t180": 120.0,
        "t200": 2.5,
    }
    for bad in (["t9=1"], ["t180"], ["t180=fast"], ["t180=0"]):
        with pytest.raises(ValueError):
            cli.parse_overrides(bad, ["t180"], "--rate-mbit")


def _fake(
    headline_run: Callable[..., dict[str, Any]], calls: list[tuple[str, float, bool, bool]]
) -> Callable[..., dict[str, Any]]:
    count: dict[tuple[str, bool], int] = {}

    def fake(workload: Any, model: str, label: str, *, rate_mbit, settings, **kw) -> dict:
        unshaped = bool(kw.get("unshaped"))
        pilot = kw.get("steps") is not None
        calls.append((label, rate_mbit, unshaped, pilot))
        if pilot:  # the reference: T_u = 96, E = 24 at 800 Mbit/s, as 1 / rate
            step = 96.0 if unshaped else 96.0 + 24.0 * 800 / rate_mbit
        else:
            # A little drift, repeat to repeat: the n-th run of this label on this link.
            n = count[label, unshaped] = count.get((label, unshaped), 0) + 1
            step = STEPS.get(label, 100.0) * (1 + 0.01 * n)
            step *= (0.7 if label.startswith("embark") else 0.6) if unshaped else 1.0
        run = headline_run(step, share=0.35, spread=1.1)
        run |= {"strategy": label, "rate_mbit": None if unshaped else rate_mbit}
        if label == "embark-towers-compressed":
            run["towers"] = {"known": True, "count": 0, "modules": [], "tables": 0}
        return run

    return fake


def test_whole_command_with_a_fake_runner(
    tmp_path: Path, headline_run: Callable[..., dict[str, Any]]
) -> None:
    calls: list[tuple[str, float, bool, bool]] = []
    out = tmp_path / "out"
    argv = ["--out-dir", str(out), "--models", "t200", "--no-estimates"]
    assert headline.main(argv, runner=_fake(headline_run, calls)) == 0
    # The pilot on torchrec-fp16: unshaped, then 800 (20% exposed), then 300 (40%: landed).
    assert calls[:3] == [
        ("torchrec-fp16", 800.0, True, True),
        ("torchrec-fp16", 800.0, False, True),
        ("torchrec-fp16", pytest.approx(300.0), False, True),
    ]
    main = calls[3:]
    assert len(main) == 6 * len(LABELS) * 2  # 6 repeats, every strategy a pair
    for r in range(6):
        rep = main[r * 2 * len(LABELS) : (r + 1) * 2 * len(LABELS)]
        assert [c[0] for c in rep[::2]] == paired.rotated(LABELS, r)
        for k, label in enumerate(paired.rotated(LABELS, r)):
            first = paired.shaped_first(r, LABELS.index(label))
            assert [c[2] for c in rep[2 * k : 2 * k + 2]] == (
                [False, True] if first else [True, False]
            )
    assert all(c[1] == pytest.approx(300.0) for c in main)
    doc = json.loads((out / "headline.json").read_text())
    (w,) = doc["workloads"]
    assert w["pilot"]["landed"] and w["rate_mbit"] == pytest.approx(300.0)
    assert doc["settings"]["exposed"] and doc["settings"]["repeats"] == 6
    s = w["summary"]
    # embark's n-th shaped run is 1 + 0.01 n times its base, torchrec's too: 100 / 200.
    assert s["embark"]["ratio"]["torchrec"]["per_repeat"] == pytest.approx([0.5] * 6)
    # Exposed: 0.4 of torchrec-fp16's step (0.6 unshaped), 0.3 of embark's.
    assert s["torchrec-fp16"]["exposed_share"]["median"] == pytest.approx(0.4)
    assert s["embark"]["exposed_share"]["median"] == pytest.approx(0.3)
    # Unshaped, embark 70 against torchrec-fp16's 96: 0.729.
    unshaped = s["embark"]["unshaped_ratio"]["torchrec-fp16"]["median"]
    assert unshaped == pytest.approx(70 / 96)
    assert s["embark"]["spread"]["median"] == pytest.approx(1.1)
    md = (out / "headline.md").read_text()
    assert "| T200 | 300 | embark | 103.5 | 0.50 [0.50, 0.50] | 0.62 [0.62, 0.62] | " in md
    assert "| faster than torchrec |" in md
    assert "embark-towers-compressed (no towers chosen: flat)" in md
    assert "pilot: torchrec-fp16 exposed 40% (landed, 2 run(s)) | 40% |" in md
    assert (out / "headline.png").stat().st_size > 0


def test_no_exposed_and_rate_override(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, headline_run: Callable[..., dict[str, Any]]
) -> None:
    monkeypatch.setattr(cli, "plot_headline", lambda *args: None)  # drawn above already
    calls: list[tuple[str, float, bool, bool]] = []
    argv = ["--out-dir", str(tmp_path), "--models", "t510", "--repeats", "2", "--no-estimates"]
    argv += ["--rate-mbit", "t510=50", "--strategies", "torchrec-twrw,embark", "--no-exposed"]
    argv += ["--dense-exchange", "hierarchical"]
    assert headline.main(argv, runner=_fake(headline_run, calls)) == 0
    assert [(c[1], c[2]) for c in calls] == [(50.0, False)] * 4  # no pilot, no unshaped run
    doc = json.loads((tmp_path / "headline.json").read_text())
    assert doc["workloads"][0]["summary"]["embark"]["exposed_ms"] is None
    md = (tmp_path / "headline.md").read_text()
    assert "none (2 repeat(s))" not in md  # no reference ran: no verdict at all
    assert "Shaped runs only (--no-exposed)" in md
    assert doc["settings"]["dense_exchange"] == "hierarchical"
    assert "exchanged hierarchical by every strategy" in md
    with pytest.raises(SystemExit):
        headline.main([*argv, "--rate-mbit", "t999=5"], runner=_fake(headline_run, calls))
