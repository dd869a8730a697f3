"""Aggregation of per-rank benchmark records into the stable result schema."""

from __future__ import annotations

import pytest

from lightning_embark.errors import ConfigError, EmbarkError
from lightning_embark.harness import BenchConfig
from lightning_embark.harness._report import format_table, summarize_run


def _record(rank: int, seconds: list[float], inter: int) -> dict:
    comm = {
        "intra_host": 10,
        "inter_host": inter,
        "by_collective": {
            "all_to_all_single": {
                "calls": 2,
                "intra_host": 10,
                "inter_host": inter,
                "blocked_seconds": 0.1,
            }
        },
    }
    return {
        "rank": rank,
        "batch_size": 100,
        "step_seconds": seconds,
        "embedding_share": [0.5] * len(seconds),
        "comm": [comm] * len(seconds),
        "peak_rss_mb": 100.0 + rank,
    }


def test_summary_uses_slowest_rank_and_sums_bytes() -> None:
    records = [_record(0, [9.0, 1.0, 2.0, 3.0], 40), _record(1, [9.0, 1.5, 1.0, 3.5], 60)]
    run = summarize_run("torchrec", records, warmup=1)
    assert run["step_time_ms"]["median"] == pytest.approx(2000.0)
    assert (
        run["step_time_ms"]["p10"] <= run["step_time_ms"]["median"] <= run["step_time_ms"]["p90"]
    )
    assert run["samples_per_s"] == pytest.approx(200 / 2.0)
    assert run["bytes_per_step"] == {
        "intra_host": 20,
        "inter_host": 100,
        "embedding_inter_host": 100,
        "by_collective": {"all_to_all_single": {"intra_host": 20, "inter_host": 100, "calls": 4}},
        "by_traffic": {},
    }
    assert run["comm_share"] == 0.5
    assert run["peak_rss_mb"] == 101.0
    assert "engine_ms" not in run
    table = format_table([run, run | {"strategy": "other"}])
    assert "torchrec" in table and "other" in table and "1.00" in table
    lines = format_table([run, run | {"strategy": "embark-torchrec-plan"}]).splitlines()
    assert len({line.index("1.00") for line in lines[2:]}) == 1, (
        "long names keep the columns aligned"
    )


def test_labelled_traffic_is_split_out_and_the_dense_part_left_out_of_the_embedding_bytes() -> (
    None
):
    """Rank records carry per-label totals; the run sums them over ranks per step, and
    the embedding part's inter-host bytes are the total minus the dense gradients' and
    the logged metrics' reductions."""
    records = [_record(r, [1.0, 1.0, 1.0], 100) for r in range(2)]
    for record in records:
        for step in range(3):
            record["comm"][step] = record["comm"][step] | {
                "by_traffic": {
                    "dense": {"calls": 1, "intra_host": 0, "inter_host": 70, "blocked_seconds": 0},
                    "metrics": {
                        "calls": 1,
                        "intra_host": 0,
                        "inter_host": 5,
                        "blocked_seconds": 0,
                    },
                    "towers:ids": {
                        "calls": 2,
                        "intra_host": 0,
                        "inter_host": 6,
                        "blocked_seconds": 0,
                    },
                }
            }
    run = summarize_run("embark-towers:identity", records, warmup=1)
    per_step = run["bytes_per_step"]
    assert per_step["inter_host"] == 200 and per_step["embedding_inter_host"] == 200 - 140 - 10
    assert per_step["by_traffic"]["towers:ids"] == {"intra_host": 0, "inter_host": 12, "calls": 4}
    flat = summarize_run("embark", [_record(r, [1.0, 1.0, 1.0], 100) for r in range(2)], warmup=1)
    header, _, _, towers_line = format_table([flat, run]).splitlines()
    assert "emb inter MB" in header
    # 50 / 200 embedding bytes against the base; records without a dense exchange say "?"
    assert towers_line.split()[-3:] == ["0.25", "101", "?"]


def test_summary_reports_engine_time_of_embark_runs() -> None:
    records = [_record(0, [9.0, 1.0, 2.0, 3.0], 40), _record(1, [9.0, 1.5, 1.0, 3.5], 60)]
    for rank, record in enumerate(records):
        record["engine_ms"] = [
            {
                "embark/embedding_forward_ms": 100.0 + 10 * step + rank,
                "embark/embedding_backward_ms": 5.0,
            }
            for step in range(4)
        ]
    run = summarize_run("embark", records, warmup=1)
    assert run["engine_ms"] == {
        "embedding_forward": 121.0,
        "embedding_backward": 5.0,
    }  # slowest rank, median


def test_summary_rejects_warmup_swallowing_all_steps() -> None:
    with pytest.raises(EmbarkError, match="warmup"):
        summarize_run("torchrec", [_record(0, [1.0, 1.0], 1)], warmup=2)


def test_bench_config_names_unknown_strategy() -> None:
    with pytest.raises(ConfigError, match="known strategies"):
        BenchConfig(model="demo-small", strategies=("nope",))
