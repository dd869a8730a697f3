"""``benchmarks/codecs_cpu.py`` prints a row per codec with positive throughputs."""

from __future__ import annotations

from pathlib import Path

import pytest

from lightning_embark.testing._ranks import load_module
from lightning_embark.wire._codecs import CODECS

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "codecs_cpu.py"


def test_table_has_every_codec(capsys: pytest.CaptureFixture[str]) -> None:
    """Throughputs print in GB/s with two decimals: 2,048 x 17 fp32 rows (139 kB) print as
    0.00 only past 28 ms a pass, so a loaded machine cannot zero them (64 rows, 4 kB, did
    past 0.9 ms)."""
    bench = load_module(SCRIPT, "_codecs_cpu")
    assert bench.main(["--rows", "2048", "--width", "17", "--repeats", "2"]) == 0
    rows = [
        line.split("|")[1:-1]
        for line in capsys.readouterr().out.splitlines()
        if line.startswith("| ")
    ]
    by_name = {cells[0].strip(): [c.strip() for c in cells[1:]] for cells in rows[1:]}
    assert set(by_name) == set(CODECS)
    for cells in by_name.values():
        encode, policy, ratio, decode = cells
        assert (
            float(encode) > 0 and float(policy) > 0 and float(decode) > 0 and ratio.endswith("x")
        )


def test_bad_sizes_are_rejected() -> None:
    bench = load_module(SCRIPT, "_codecs_cpu")
    with pytest.raises(SystemExit):
        bench.main(["--rows", "0"])
