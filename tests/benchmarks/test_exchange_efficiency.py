"""``benchmarks/exchange_efficiency.py``: the efficiency formula, the cases and the table."""

from __future__ import annotations

from pathlib import Path

import pytest

from lightning_embark.harness import efficiency, link_bytes
from lightning_embark.testing._ranks import load_module

REPO = Path(__file__).resolve().parents[2]
bench = load_module(REPO / "benchmarks" / "exchange_efficiency.py", "exchange_efficiency_test")


def test_link_bytes_is_the_busiest_hosts_egress() -> None:
    # Ranks 0, 1 on host 0 and 2, 3 on host 1: a host's ranks share its link.
    assert link_bytes([1, 2, 4, 8], 2) == 12
    assert link_bytes([5, 1, 1, 1], 2) == 6
    assert link_bytes([1, 2, 4, 8], 1) == 8  # one rank per host: the busiest rank
    assert link_bytes([], 2) == 0
    with pytest.raises(ValueError, match="ranks_per_host"):
        link_bytes([1], 0)


def test_efficiency_is_line_time_over_measured_time() -> None:
    # 8 MB over a 100 MB/s link take 80 ms; measured 100 ms: 0.8 of line rate.
    assert efficiency(8e6, 100e6, 0.1) == pytest.approx(0.8)
    assert efficiency(8e6, 100e6, 0.08) == pytest.approx(1.0)
    assert efficiency(0, 100e6, 0.1) is None  # nothing crossed
    assert efficiency(8e6, 0, 0.1) is None  # loopback: no rate
    assert efficiency(8e6, 100e6, 0) is None


def test_rows_per_peer_keep_the_fp32_size_and_ub_is_unequal() -> None:
    rb = bench.send_rows("rb", 1024, 0, 4)
    assert rb == [512] * 4 and sum(rb) * 4 * bench.WIDTH == 1024 * 1024
    ub = [bench.send_rows("ub", 1024, src, 4) for src in range(4)]
    assert ub[0] == [256, 768, 256, 768] and ub[1] == [768, 256, 768, 256]
    assert all(sum(row) == sum(rb) for row in ub)  # the same bytes per rank as rb


def test_row_and_table_use_the_busiest_host_and_both_rates() -> None:
    case = bench.Case("rb", "hier", "fp32", 8192)
    row = bench.row_result(
        case,
        seconds=0.1,
        inter_by_rank=[4_000_000, 4_000_000, 3_000_000, 3_000_000],
        intra_by_rank=[2_000_000] * 4,
        sent_by_rank=[8_400_000] * 4,
        ranks_per_host=2,
        line_mb_s=90.0,
        nominal_mb_s=100.0,
        loopback_mb_s=900.0,
    )
    assert row["link_mb"] == pytest.approx(8.0)
    assert row["achieved_mb_s"] == pytest.approx(80.0)
    assert row["efficiency"] == pytest.approx(80 / 90)
    assert row["efficiency_nominal"] == pytest.approx(0.8)
    loop = bench.row_result(
        case,
        seconds=0.1,
        inter_by_rank=[1, 1, 1, 1],
        intra_by_rank=[1] * 4,
        sent_by_rank=[1] * 4,
        ranks_per_host=2,
        line_mb_s=None,
        nominal_mb_s=None,
        loopback_mb_s=900.0,
    )
    table = bench.format_table([row, loop])
    lines = table.splitlines()
    assert lines[0].split() == [
        "cluster", "exch", "wire", "MB/rank", "link", "MB", "ms", "MB/s", "line", "MB/s", "eff",
        "eff", "nom",
    ]  # fmt: skip
    assert lines[2].split() == [
        "rb", "hier", "fp32", "8.400", "8.000", "100.0", "80.0", "90.0", "0.89", "0.80",
    ]  # fmt: skip
    assert lines[3].split()[-3:] == ["-", "-", "-"]  # loopback: no rate, no efficiency


def test_cases_sweep_every_combination_exchange_outermost() -> None:
    args = bench.parse_args(["--sizes-kb", "64,1024", "--wires", "fp32,bf16"])
    todo = bench.cases(args)
    assert len(todo) == 2 * 2 * 2 * 2
    assert [c.exchange for c in todo[:8]] == ["flat"] * 8
    with pytest.raises(SystemExit):
        bench.parse_args(["--wires", "fp64"])
