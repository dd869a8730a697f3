"""``benchmarks/headline.py``: the pilot's rate formula, paired ratios, the figure's stacking
split and tables, checked against values worked by hand; the whole command with a fake
runner in place of the emulated cluster (no torchrun, no namespaces)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from lightning_embark.testing._ranks import load_module

REPO = Path(__file__).resolve().parents[2]
headline = load_module(REPO / "benchmarks" / "headline.py", "headline_under_test")


def test_pilot_rate_hits_the_target_share_by_hand() -> None:
    # s = 0.1 at 800: r* = 800 * 0.1 * 0.625 / (0.375 * 0.9) = 148.148...
    assert headline.pilot_rate(800, 0.1) == pytest.approx(148.1481481, rel=1e-9)
    # s = 0.6 at 800: r* = 800 * 0.6 * 0.625 / (0.375 * 0.4) = 2000
    assert headline.pilot_rate(800, 0.6) == pytest.approx(2000.0)
    assert headline.pilot_rate(800, 0.375) == pytest.approx(800.0)  # already there
    # At r* the model's share is the target: E* = s T r / r*, C = (1 - s) T.
    s, r = 0.2, 500.0
    chosen = headline.pilot_rate(r, s, target=0.3)
    exchange = s * r / chosen
    assert exchange / (exchange + (1 - s)) == pytest.approx(0.3)


def test_pilot_rate_clamps_and_refuses_a_zero_share() -> None:
    assert headline.pilot_rate(800, 0.999999) == headline.RATE_MAX_MBIT
    assert headline.pilot_rate(800, 1.0) == headline.RATE_MAX_MBIT
    assert headline.pilot_rate(800, 1e-9) == headline.RATE_MIN_MBIT
    assert headline.pilot_rate(800, 0.6, high=1000) == 1000
    with pytest.raises(ValueError, match="--rate-mbit"):
        headline.pilot_rate(800, 0.0)
    with pytest.raises(ValueError, match="target"):
        headline.pilot_rate(800, 0.2, target=1.0)


def test_rotated_orders_and_quantile() -> None:
    items = ["a", "b", "c"]
    assert [headline.rotated(items, r) for r in range(4)] == [
        ["a", "b", "c"],
        ["b", "c", "a"],
        ["c", "a", "b"],
        ["a", "b", "c"],
    ]
    assert headline.quantile([3.0, 1.0, 2.0], 0.1) == pytest.approx(1.2)
    assert headline.quantile([3.0, 1.0, 2.0], 0.9) == pytest.approx(2.8)
    assert headline.quantile([5.0], 0.9) == 5.0


def _run(step_ms: float, share: float = 0.3, emb: int = 2_000_000, dense: int = 3_000_000):
    return {
        "step_time_ms": {"median": step_ms, "p10": step_ms, "p90": step_ms},
        "comm_share": share,
        "bytes_per_step": {
            "inter_host": emb + dense,
            "embedding_inter_host": emb,
            "by_traffic": {"dense": {"inter_host": dense, "intra_host": 0, "calls": 1}},
        },
        "dense_compression": "fp32",
        "dense_exchange": "flat",
    }


def test_aggregate_pairs_ratios_within_repeats() -> None:
    twrw = [100.0, 200.0, 120.0]
    embark = [60.0, 100.0, 90.0]
    repeats = [
        {"torchrec-twrw": _run(t, share=s), "embark": _run(e, share=0.1, emb=1_000_000)}
        for t, e, s in zip(twrw, embark, (0.3, 0.4, 0.5), strict=True)
    ]
    out = headline.aggregate(repeats, ["torchrec-twrw", "embark"])
    e = out["embark"]
    assert e["step_ms"]["median"] == 90.0
    assert e["step_ms"]["p10"] == pytest.approx(66.0)  # 60 + 0.2 * (90 - 60)
    assert e["step_ms"]["p90"] == pytest.approx(98.0)  # 90 + 0.8 * (100 - 90)
    # Paired: 0.6, 0.5, 0.75 -> 0.6; the ratio of medians would be 90 / 120 = 0.75.
    assert e["ratio"]["torchrec-twrw"]["per_repeat"] == pytest.approx([0.6, 0.5, 0.75])
    assert e["ratio"]["torchrec-twrw"]["median"] == pytest.approx(0.6)
    assert "torchrec-fp16" not in e["ratio"]  # not run: no ratio
    assert out["torchrec-twrw"]["ratio"]["torchrec-twrw"]["median"] == 1.0
    assert out["torchrec-twrw"]["comm_share"] == 0.4
    assert (e["embedding_inter_mb"], e["dense_inter_mb"]) == (1.0, 3.0)
    assert e["dense_compression"] == "fp32" and e["dense_exchange"] == "flat"
    assert e["num_repeats"] == 3


def test_dense_wire_and_stacking_split_by_hand() -> None:
    # 10 MB over 2 hosts: 5 MB per host link = 40 Mbit at 800 Mbit/s = 50 ms
    assert headline.dense_wire_ms(10e6, num_hosts=2, rate_mbit=800) == pytest.approx(50.0)
    assert headline.dense_wire_ms(10e6, num_hosts=2, rate_mbit=None) == 0.0
    assert headline.stack_split(100.0, 0.4, 30.0) == pytest.approx((30.0, 40.0, 30.0))
    # Dense capped at what the exchange leaves: 100 - 40 = 60.
    assert headline.stack_split(100.0, 0.4, 80.0) == pytest.approx((0.0, 40.0, 60.0))
    assert sum(headline.stack_split(250.0, 0.37, 12.5)) == pytest.approx(250.0)


def test_uniform_width_and_overrides() -> None:
    t180 = [128] * 96 + [64] * 65 + [32] * 6 + [256] * 10  # mean 108.5 -> 112
    assert headline.uniform_width(t180) == 112
    assert headline.uniform_width([32, 64]) == 48
    assert headline.parse_overrides(["t180=120", "t200=2.5"], ["t180", "t200"], "x") == {
        "t180": 120.0,
        "t200": 2.5,
    }
    for bad in (["t9=1"], ["t180"], ["t180=fast"], ["t180=0"]):
        with pytest.raises(ValueError):
            headline.parse_overrides(bad, ["t180"], "--rate-mbit")


def test_spec_for_bench_rewrites_only_mixed_widths(tmp_path: Path) -> None:
    workloads = {w.key: w for w in headline.WORKLOADS}
    assert headline.spec_for_bench(workloads["t200"], tmp_path) == (
        "hugectr-200table-100B-hotness20",
        128,
    )
    path, width = headline.spec_for_bench(workloads["t180"], tmp_path)
    spec = json.loads(Path(path).read_text())
    assert width == 112 and {t["embedding_dim"] for t in spec["tables"]} == {112}
    assert len(spec["tables"]) == 177 and spec["name"].endswith("-w112")


def test_whole_command_with_a_fake_runner(tmp_path: Path) -> None:
    calls: list[tuple[str, float | None, int | None]] = []

    def fake(workload: Any, model: str, label: str, *, rate_mbit, settings, **kw) -> dict:
        calls.append((label, rate_mbit, kw.get("steps")))
        pilot = kw.get("steps") is not None
        step = {"torchrec-twrw": 200.0, "torchrec-fp16": 160.0}.get(label, 100.0)
        run = _run(step, share=0.1 if pilot else 0.35)
        return run | {"strategy": label, "rate_mbit": rate_mbit}

    out = tmp_path / "out"
    code = headline.main(
        ["--out-dir", str(out), "--models", "t200", "--repeats", "2", "--no-estimates"],
        runner=fake,
    )
    assert code == 0
    rate = headline.pilot_rate(800, 0.1)
    assert calls[0] == ("torchrec-twrw", 800.0, 5)  # the pilot at the start rate
    labels = list(headline.STRATEGY_RUNS)
    assert [c[0] for c in calls[1:]] == labels + headline.rotated(labels, 1)
    assert all(r == pytest.approx(rate) for _, r, _ in calls[1:])
    doc = json.loads((out / "headline.json").read_text())
    (w,) = doc["workloads"]
    assert w["pilot"]["share"] == 0.1 and w["rate_mbit"] == pytest.approx(rate)
    assert w["summary"]["embark"]["ratio"]["torchrec-fp16"]["median"] == pytest.approx(0.625)
    md = (out / "headline.md").read_text()
    row = "| T200 | 148.1 | embark-compressed | 100.0 | 100.0-100.0 | 0.50 | 0.62 | 35% | 2.00 |"
    assert f"{row} 3.00 | fp32 flat |" in md
    assert (out / "headline.png").stat().st_size > 0


def test_rate_override_skips_the_pilot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(headline, "plot_headline", lambda *args: None)  # drawn above already
    rates: list[float | None] = []

    def fake(workload: Any, model: str, label: str, *, rate_mbit, settings, **kw) -> dict:
        rates.append(rate_mbit)
        return _run(100.0) | {"strategy": label, "rate_mbit": rate_mbit}

    argv = ["--out-dir", str(tmp_path), "--models", "t510", "--repeats", "1", "--no-estimates"]
    argv += ["--rate-mbit", "t510=50", "--strategies", "torchrec-twrw,embark"]
    assert headline.main(argv, runner=fake) == 0
    assert rates == [50.0, 50.0]
    with pytest.raises(SystemExit):
        headline.main([*argv, "--rate-mbit", "t999=5"], runner=fake)


def test_condense_plan_summary_counts_layouts() -> None:
    text = (
        "topology emulated: 2 host(s) x 2 rank(s)\n"
        "model.sparse_arch.embedding_bag_collection:\n"
        "  t_t0: table_row_wise (fused) ranks=[0, 1]\n"
        "  t_t1: table_row_wise (fused) ranks=[2, 3]\n"
        "  t_t2: data_parallel (dense) ranks=[0, 1, 2, 3]\n"
    )
    assert headline.condense_plan_summary(text) == [
        "topology emulated: 2 host(s) x 2 rank(s)",
        "model.sparse_arch.embedding_bag_collection:",
        "table_row_wise (fused) x 2",
        "data_parallel (dense) x 1",
    ]
