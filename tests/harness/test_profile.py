"""``embark-bench --profile``: cluster phases labelled from outside the engine, summarised
against the link rate; one step's dispatch counts per rank, for every run."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch

from lightning_embark._traffic import AHEAD, current_traffic, is_ahead, traffic, under_ahead
from lightning_embark.accounting import DispatchCounter, scope
from lightning_embark.engine._lane import Lane, Pending
from lightning_embark.harness import BenchConfig
from lightning_embark.harness._profile import (
    dispatch_step,
    format_dispatch_run,
    format_profile_table,
    label_cluster_phases,
    phase_label,
    split_label,
    summarize_dispatch,
    summarize_profile,
)


class _FakeExchange:
    def __init__(self, seen: list[str | None]) -> None:
        self.seen = seen
        self.size = 4

    def __call__(self, *args: Any) -> tuple[Any, list[int]]:
        self.seen.append(current_traffic())
        return None, []


class _FakeCluster:
    """Issues its collectives in the order :class:`RemoteCluster` does, the rows and the
    owners' side of backward on the engine's lane (another thread)."""

    def __init__(self, name: str, seen: list[str | None], lane: Lane) -> None:
        self.name = name
        self.seen = seen
        self.lane = lane
        self.exchange = _FakeExchange(seen)

        self.input_exchange = _FakeExchange(seen)

    def start_forward(self, prepared: bool = False) -> Pending[None]:
        if not prepared:
            self.lane.run(self.distribute)
        return self.lane.start(self.receive)

    def distribute(self, ahead: bool = False) -> None:
        exchange = self.input_exchange if ahead else self.exchange
        exchange()  # header
        exchange()  # ids

    def receive(self) -> None:
        self.seen.append(current_traffic())  # a host reduction's own collective
        self.exchange()

    def start_backward(self) -> Pending[None]:
        return self.lane.start(self.update_owners)

    def update_owners(self) -> None:
        self.grads_to_owners()
        self.exchange()  # a replica sync

    def grads_to_owners(self) -> None:
        self.exchange()


class _FakeDP:
    def __init__(self, seen: list[str | None], lane: Lane) -> None:
        self.name = "dp"
        self.seen = seen
        self.lane = lane

    def start_forward(self) -> Pending[None]:
        return Pending.done(None)

    def start_backward(self) -> Pending[None]:
        return self.lane.start(lambda: self.seen.append(current_traffic()))  # its all-reduce


class _Engine(torch.nn.Module):
    def __init__(self, clusters: list[Any]) -> None:
        super().__init__()
        self._clusters = [(c, [0]) for c in clusters]


def test_phases_are_labelled_in_the_order_a_step_issues_them() -> None:
    seen: list[str | None] = []
    lane = Lane(torch.device("cpu"), overlap=True)
    rb, dp = _FakeCluster("rb", seen, lane), _FakeDP(seen, lane)
    root = torch.nn.Sequential(_Engine([rb, dp]))
    assert label_cluster_phases(root) == ["rb", "dp"]
    assert label_cluster_phases(root) == ["rb", "dp"]  # idempotent: not wrapped twice
    for _ in range(2):  # the call index restarts every forward
        seen.clear()
        rb.start_forward().wait()
        rb.start_backward().wait()
        dp.start_forward().wait()
        dp.start_backward().wait()
        assert seen == [
            "exchange:rb:header",
            "exchange:rb:ids",
            "exchange:rb:rows",
            "exchange:rb:rows",
            "exchange:rb:grads",
            "exchange:rb:sync",
            "exchange:dp:grads",
        ]
    assert current_traffic() is None
    assert rb.exchange.size == 4  # the wrapper passes attributes through
    # The input pipeline distributes the next batch on its own thread, mid-step here: its
    # labels stay the pipeline's (ahead) traffic, with the phase under them.
    seen.clear()
    rb.start_forward(prepared=True).wait()

    def ahead() -> None:
        with traffic(AHEAD):
            rb.distribute(ahead=True)

    thread = threading.Thread(target=ahead)
    thread.start()
    thread.join()
    rb.start_backward().wait()
    assert seen == [
        "exchange:rb:rows",
        "exchange:rb:rows",
        under_ahead("exchange:rb:header"),
        under_ahead("exchange:rb:ids"),
        "exchange:rb:grads",
        "exchange:rb:sync",
    ]
    assert all(is_ahead(label) for label in seen[2:4])
    lane.close()


def test_labels_round_trip_and_ignore_other_traffic() -> None:
    assert split_label(phase_label("rb:fp16", "rows")) == ("rb:fp16", "rows")
    assert split_label("towers:ids") is None
    assert split_label("exchange:rb:forward") is None
    assert split_label(under_ahead(phase_label("rb", "ids"))) == ("rb", "ids")


def _stats(inter: int, seconds: float, intra: int = 0) -> dict[str, Any]:
    return {"calls": 1, "intra_host": intra, "inter_host": inter, "blocked_seconds": seconds}


def _record(rank: int, steps: list[dict[str, Any]]) -> dict[str, Any]:
    return {"rank": rank, "comm": [{"by_traffic": s} for s in steps]}


def test_summary_takes_the_busiest_host_and_the_slowest_rank() -> None:
    rows_label, ids_label = phase_label("ub", "rows"), phase_label("ub", "ids")
    # 2 hosts x 2 ranks; step 0 is warm-up. Host 0 sends 3 + 5 = 8 MB, host 1 6 MB.
    step = {rows_label: None, ids_label: _stats(1000, 0.001), "dense": _stats(99, 1.0)}
    records = []
    for rank, (inter, seconds) in enumerate([(3e6, 0.08), (5e6, 0.1), (3e6, 0.05), (3e6, 0.05)]):
        steps = [dict(step, **{rows_label: _stats(int(inter), seconds)}) for _ in range(3)]
        steps[0] = {rows_label: _stats(1, 9.0)}
        records.append(_record(rank, steps))
    rows = summarize_profile(records, range(1, 3), ranks_per_host=2, rate_mbit=800.0)
    assert [(r["cluster"], r["phase"]) for r in rows] == [("ub", "ids"), ("ub", "rows")]
    rows_row = rows[1]
    assert rows_row["link_bytes"] == 8_000_000
    assert rows_row["inter_host_bytes"] == 14_000_000
    assert rows_row["ms"] == pytest.approx(100.0)
    assert rows_row["achieved_mb_s"] == pytest.approx(80.0)
    assert rows_row["efficiency"] == pytest.approx(0.8)  # 8 MB at 100 MB/s: 80 of 100 ms
    loopback = summarize_profile(records, range(1, 3), ranks_per_host=2, rate_mbit=None)
    assert loopback[1]["efficiency"] is None
    table = format_profile_table("embark", rows, 800.0)
    assert "800 Mbit/s = 100.0 MB/s" in table
    assert table.splitlines()[-1].split() == [
        "ub", "rows", "1", "100.00", "8.000", "14.000", "0.000", "80.0", "0.80",
    ]  # fmt: skip
    assert "no efficiency" in format_profile_table("embark", loopback, None)


def test_profile_is_passed_to_every_run(tmp_path: Any) -> None:
    """Every run counts a step's dispatches; only embark's have cluster phases to label
    (the worker labels them where it finds an engine)."""
    from lightning_embark.harness import RankJob

    config = BenchConfig(model="demo-small", strategies=("torchrec", "embark"), profile=True)
    for strategy in config.strategies:
        job = RankJob(config=config, strategy=strategy, out_dir=tmp_path)
        assert RankJob.from_json(job.to_json()).config.profile, strategy
    assert not BenchConfig(model="demo-small", strategies=("embark",)).profile


def test_the_counted_step_keeps_clear_of_the_measured_ones() -> None:
    assert [dispatch_step(w) for w in (0, 1, 2, 3, 5)] == [0, 0, 0, 1, 3]


def test_dispatch_counts_are_summarised_per_rank_with_the_steps_calls() -> None:
    counter = DispatchCounter()
    with counter.counting(), scope("rb:ahead"):
        torch.ones(3).nonzero()
    counts = counter.snapshot().to_dict()
    comm = [{"by_collective": {"all_to_all_single": {"calls": n}}} for n in (9, 4, 4)]
    records = [
        {"rank": r, "dispatch": {"step": 1, "counts": counts}, "comm": comm} for r in (0, 1)
    ] + [{"rank": 2, "comm": comm}]  # a rank without a count (none recorded) is left out
    rows = summarize_dispatch(records)
    assert [(r["rank"], r["step"], r["collectives"]) for r in rows] == [
        (0, 1, {"all_to_all_single": 4}),
        (1, 1, {"all_to_all_single": 4}),
    ]
    text = format_dispatch_run("embark", rows)
    assert text.startswith("embark: what a GPU would see of step 1 (rank 0 ")
    assert "rank 1 " in text.splitlines()[0] and "| rb:ahead |" in text
    assert "all_to_all_single 4" in text
