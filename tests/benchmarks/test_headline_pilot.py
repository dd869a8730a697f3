"""``benchmarks/_headline/pilot.py``: the pilot's rate formula against values worked by hand,
its clamping, and the pilot's iteration on the reference's exposed share with a fake runner
whose exposed time follows the model exactly (``E = E_0 r_0 / r``), or does not."""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from lightning_embark.testing._ranks import load_module

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
# Loading the script puts its folder, where its package ``_headline`` lives, on sys.path.
load_module(BENCHMARKS / "headline.py", "headline_under_test")
pilot = importlib.import_module("_headline.pilot")
runs = importlib.import_module("_headline.runs")
workloads = importlib.import_module("_headline.workloads")

SETTINGS = runs.RunSettings(
    steps=10, warmup=3, allow=("fp16",), dense_compression="fp32", loopback=False, seed=0
)
T200 = next(w for w in workloads.WORKLOADS if w.key == "t200")


def test_pilot_rate_by_hand() -> None:
    # T_u = 300, E = 100 at 800: E* = 0.4 / 0.6 * 300 = 200 -> r* = 800 * 100 / 200 = 400.
    assert pilot.pilot_rate(800, 100.0, 300.0) == pytest.approx(400.0)
    # E = 300 at 800, target 0.3: E* = 0.3 / 0.7 * 300 = 128.57 -> r* = 1866.67.
    assert pilot.pilot_rate(800, 300.0, 300.0, target=0.3) == pytest.approx(
        800 * 300 / (300 * 3 / 7)
    )
    # At r* the model's share is the target: E(r*) = E r / r*, share E(r*) / (T_u + E(r*)).
    rate, exposed, unshaped = 500.0, 70.0, 260.0
    chosen = pilot.pilot_rate(rate, exposed, unshaped, target=0.35)
    e_star = exposed * rate / chosen
    assert e_star / (unshaped + e_star) == pytest.approx(0.35)


def test_pilot_rate_clamps_and_handles_no_exposure() -> None:
    assert pilot.pilot_rate(800, 1e9, 1.0) == pilot.RATE_MAX_MBIT
    assert pilot.pilot_rate(800, 1e-9, 1e6) == pilot.RATE_MIN_MBIT
    assert pilot.pilot_rate(800, 100.0, 300.0, high=300) == 300
    assert pilot.pilot_rate(800, 0.0, 300.0) == pytest.approx(200.0)  # a quarter
    assert pilot.pilot_rate(800, -5.0, 300.0) == pytest.approx(200.0)
    with pytest.raises(ValueError, match="target"):
        pilot.pilot_rate(800, 10.0, 300.0, target=1.0)
    with pytest.raises(ValueError, match="unshaped"):
        pilot.pilot_rate(800, 10.0, 0.0)


def _model_runner(
    headline_run: Callable[..., dict[str, Any]],
    unshaped_ms: float,
    exposed_at: Callable[[float], float],
) -> tuple[Callable[..., dict[str, Any]], list[tuple[str, float, bool]]]:
    calls: list[tuple[str, float, bool]] = []

    def fake(workload: Any, model: str, label: str, *, rate_mbit, settings, **kw) -> dict:
        unshaped = kw.get("unshaped", False)
        calls.append((label, rate_mbit, unshaped))
        assert kw["steps"] == 5 and kw["warmup"] == 2  # pilot steps
        step = unshaped_ms if unshaped else unshaped_ms + exposed_at(rate_mbit)
        return headline_run(step) | {"rate_mbit": None if unshaped else rate_mbit}

    return fake, calls


def _choose(runner: Callable[..., dict[str, Any]], **kw: Any) -> tuple[Any, str, Any]:
    return pilot.choose_rate(
        T200,
        "m",
        override=kw.get("override"),
        start_rate=800.0,
        pilot_steps=5,
        pilot_warmup=2,
        target=0.4,
        settings=kw.get("settings", SETTINGS),
        runner=runner,
    )


def test_pilot_lands_on_the_reference_in_two_runs(
    headline_run: Callable[..., dict[str, Any]],
) -> None:
    # T_u = 96; E = 24 at 800 (share 24 / 120 = 20%, below 30%); E* = 0.4 / 0.6 * 96 = 64
    # -> r = 800 * 24 / 64 = 300, where E = 24 * 800 / 300 = 64: share 64 / 160 = 40%.
    fake, calls = _model_runner(headline_run, 96.0, lambda r: 24.0 * 800 / r)
    rate, source, record = _choose(fake)
    assert calls == [
        ("torchrec-fp16", 800.0, True),
        ("torchrec-fp16", 800.0, False),
        ("torchrec-fp16", pytest.approx(300.0), False),
    ]
    assert rate == pytest.approx(300.0) and record["landed"]
    assert [r["exposed_share"] for r in record["runs"]] == pytest.approx([0.2, 0.4])
    assert record["unshaped_step_ms"] == 96.0 and "landed, 2 run(s)" in source


def test_pilot_that_does_not_land_says_so(headline_run: Callable[..., dict[str, Any]]) -> None:
    # The link never costs more than 10 ms (the model's 1/rate fails, and no run reaches the
    # target to bracket it): each rate E / E* of the last (E* = 64), 800 * (10 / 64)^k.
    fake, calls = _model_runner(headline_run, 96.0, lambda r: 10.0)
    rate, source, record = _choose(fake)
    runs = pilot.MAX_SHAPED_RUNS
    assert len(calls) == 1 + runs and not record["landed"]
    assert [c[1] for c in calls[1:]] == pytest.approx(
        [800.0 * (10 / 64) ** k for k in range(runs)]
    )
    assert rate == pytest.approx(800.0 * (10 / 64) ** runs)
    assert f"not landed in {runs} runs; next rate, unmeasured" in source


def test_bracketed_rate_by_hand() -> None:
    # 10% at 800, 70% at 100: 40% is halfway in share, so halfway in log rate: sqrt(800 * 100).
    runs = [
        {"rate_mbit": 800.0, "exposed_share": 0.10},
        {"rate_mbit": 100.0, "exposed_share": 0.70},
    ]
    assert pilot.bracketed_rate(runs, 0.4) == pytest.approx((800 * 100) ** 0.5)
    # The nearest run on each side counts: 25% at 400 and 70% at 100 -> a third of the way.
    nearer = [*runs, {"rate_mbit": 400.0, "exposed_share": 0.25}]
    assert pilot.bracketed_rate(nearer, 0.4) == pytest.approx(400 * (100 / 400) ** (1 / 3))
    assert pilot.bracketed_rate(runs[:1], 0.4) is None  # one side only
    assert pilot.bracketed_rate(runs[1:], 0.4) is None


def test_pilot_lands_on_a_reference_that_hides_its_exchange_until_the_link_saturates(
    headline_run: Callable[..., dict[str, Any]],
) -> None:
    """A pipelined reference hides up to H ms of its exchange: ``E = max(5, B / r - H)``
    (B = 106,320 ms Mbit/s, H = 112 ms, T_u = 330 ms: about MLPerf's 6% at 800 and 81% at
    70 Mbit/s). The 1/rate model takes it from 800 (E = 20.9 ms, 6%) to 76 Mbit/s
    (E* = 220 ms; there E = 1,287 ms, 80%); the third rate is interpolated between those
    two (about 269 Mbit/s: E = 283 ms, 46%) and lands, where the model alone would have
    gone back up to 445 Mbit/s (28%)."""
    exposed = lambda r: max(5.0, 106_320 / r - 112)  # noqa: E731
    fake, _ = _model_runner(headline_run, 330.0, exposed)
    rate, source, record = _choose(fake)
    first, second, third = record["runs"]
    assert second["rate_mbit"] == pytest.approx(800 * first["exposed_ms"] / (0.4 / 0.6 * 330))
    assert third["rate_mbit"] == pytest.approx(pilot.bracketed_rate([first, second], 0.4))
    assert third["rate_mbit"] == pytest.approx(269, rel=0.01)
    assert record["landed"] and rate == third["rate_mbit"] and "landed, 3 run(s)" in source
    assert 0.3 <= third["exposed_share"] <= 0.5


def test_pilot_skipped_by_override_loopback_and_the_compute_bound_row(
    headline_run: Callable[..., dict[str, Any]],
) -> None:
    fake, calls = _model_runner(headline_run, 96.0, lambda r: 24.0)
    assert _choose(fake, override=50.0)[:2] == (50.0, "--rate-mbit")
    loopback = dataclasses.replace(SETTINGS, loopback=True)
    assert _choose(fake, settings=loopback)[0] is None
    compute = next(w for w in workloads.WORKLOADS if not w.pilot)
    rate, _, record = pilot.choose_rate(
        compute,
        "m",
        override=None,
        start_rate=800.0,
        pilot_steps=5,
        pilot_warmup=2,
        target=0.4,
        settings=SETTINGS,
        runner=fake,
    )
    assert rate == pilot.DEFAULT_RATE_MBIT and record is None and calls == []


def test_pilot_measures_the_unshaped_step_again_when_a_link_seems_free(
    headline_run: Callable[..., dict[str, Any]],
) -> None:
    """The first unshaped run came out slow (150 ms, cold caches) and the shaped run at
    800 Mbit/s faster (120 ms): the pilot measures the unshaped step again (96 ms) and
    goes on from E = 120 - 96 = 24 as in the landing test: 300 Mbit/s, 40%."""
    unshaped = iter([150.0, 96.0])
    calls: list[tuple[float, bool]] = []

    def fake(workload: Any, model: str, label: str, *, rate_mbit, settings, **kw) -> dict:
        calls.append((rate_mbit, kw["unshaped"]))
        step = next(unshaped) if kw["unshaped"] else 96.0 + 24.0 * 800 / rate_mbit
        return headline_run(step) | {"rate_mbit": rate_mbit}

    rate, _, record = _choose(fake)
    assert [u for _, u in calls] == [True, False, True, False]
    assert rate == pytest.approx(300.0) and record["landed"]
    assert record["remeasured"] == {"first_ms": 150.0, "then_ms": 96.0}
    assert record["unshaped_step_ms"] == 96.0
    assert [r["exposed_ms"] for r in record["runs"]] == pytest.approx([24.0, 64.0])
