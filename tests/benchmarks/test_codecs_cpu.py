"""``benchmarks/codecs_cpu.py`` prints a row per codec with positive throughputs."""

from __future__ import annotations

from pathlib import Path

import pytest

from lightning_embark.testing._ranks import load_module
from lightning_embark.wire._codecs import CODECS

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "codecs_cpu.py"


def test_table_has_every_codec(capsys: pytest.CaptureFixture[str]) -> None:
    bench = load_module(SCRIPT, "_codecs_cpu")
    assert bench.main(["--rows", "64", "--width", "17", "--repeats", "2"]) == 0
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
