"""``benchmarks/engine_step.py`` runs a configuration on gloo ranks and prints its row."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from lightning_embark.testing._ranks import load_module

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.multiprocess
def test_engine_step_prints_a_row_per_configuration(capfd: pytest.CaptureFixture[str]) -> None:
    bench = load_module(REPO / "benchmarks" / "engine_step.py", "engine_step_under_test")
    assert (
        bench.main(
            ["--batch", "8", "--steps", "2", "--clusters", "rb,ub", "--compressions", "int8"]
        )
        == 0
    )
    out = capfd.readouterr().out
    rows = re.findall(
        r"^\| (rb|ub) \| int8 \| flat \| ([\d.]+) \| ([\d.]+)-([\d.]+) \| ([\d.]+) \| "
        r"([\d.]+) \|$",
        out,
        re.M,
    )
    assert [r[0] for r in rows] == ["rb", "ub"], out
    assert all(float(lo) <= float(med) <= float(hi) for _, med, lo, hi, _, _ in rows)
    # The engine's own CPU is measured (the step does work outside its collectives), and so
    # is the time inside them: each step's exchanges cross gloo, tens of microseconds or more
    # per collective, well above the 0.005 ms that would print as 0.00.
    assert all(float(cpu) > 0 and float(wait) > 0 for *_, cpu, wait in rows), out


def test_engine_step_rejects_bad_arguments() -> None:
    bench = load_module(REPO / "benchmarks" / "engine_step.py", "engine_step_under_test")
    with pytest.raises(SystemExit):
        bench.main(["--clusters", "dp"])
    with pytest.raises(SystemExit):
        bench.main(["--world", "3"])
