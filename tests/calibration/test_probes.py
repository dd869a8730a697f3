"""Calibration measurements on real gloo ranks and single-process shapes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lightning_embark.calibration._fit import build_calibration, fit_lookup
from lightning_embark.calibration._probes import (
    hierarchical_series,
    host_groups,
    lookup_shapes,
    measure_all,
    measure_unique_pooling,
)
from lightning_embark.errors import ConfigError
from lightning_embark.planner._hardware import Calibration
from lightning_embark.testing._ranks import run_gloo_ranks


def test_host_groups() -> None:
    assert host_groups(4, 2) == ([[0, 1], [2, 3]], [[0, 2], [1, 3]])
    with pytest.raises(ConfigError, match="must divide"):
        host_groups(4, 3)


def test_unique_pooling_records_fit_like_lookups() -> None:
    points = [
        measure_unique_pooling(rows=n, dim=w, batch=b, hotness=h, repeats=1)
        for b, h, w, n in lookup_shapes(64, 16, 2000)
    ]
    assert all(
        p["kernel"] == "unique-pool" and 0 < p["unique_rows"] <= min(p["ids"], p["rows"])
        for p in points
    )
    assert all(p["forward_s"] > 0 and p["backward_s"] > 0 for p in points)
    fit = fit_lookup(points)
    assert fit.bandwidth > 0 and min(fit.bag, fit.id, fit.unique_row) >= 0


def _hierarchical_rank(rank: int, world: int, out: str) -> None:
    series = hierarchical_series([4096, 65536], 2, repeats=2, progress=lambda _msg: None)
    assert (
        hierarchical_series([4096, 65536], 4, repeats=1, progress=lambda _msg: None) is None
    )  # one host
    if rank == 0:
        Path(out).write_text(json.dumps(series))


@pytest.mark.multiprocess
def test_hierarchical_series_on_two_hosts_of_two(tmp_path: Path) -> None:
    out = tmp_path / "series.json"
    run_gloo_ranks(_hierarchical_rank, 4, str(out))
    series = json.loads(out.read_text())
    assert (
        series["world"] == 4 and series["ranks_per_host"] == 2 and series["sizes"] == [4096, 65536]
    )
    assert len(series["seconds"]) == 2 and all(t > 0 for t in series["seconds"])


def _measure_rank(rank: int, world: int, out: str) -> None:
    result = measure_all(
        sizes=[65536, 1 << 20, 4 << 20],
        ranks_per_host=1,
        repeats=3,
        lookup_rows=2000,
        lookup_batch=64,
        dim=16,
    )
    if rank == 0:
        Path(out).write_text(json.dumps(result))


@pytest.mark.multiprocess
def test_real_measurement_on_two_gloo_ranks(tmp_path: Path) -> None:
    out = tmp_path / "raw.json"
    for attempt in range(3):  # loopback timings of tiny messages are noisy on a busy machine
        run_gloo_ranks(_measure_rank, 2, str(out))
        measured = json.loads(out.read_text())
        try:
            calib, _ = build_calibration(measured, label="local loopback")
            break
        except ConfigError as error:
            if "does not grow" not in str(error) or attempt == 2:
                raise
    assert (
        measured["world"] == 2
        and measured["num_hosts"] == 2
        and measured["alltoall_intra"] is None
    )
    assert len(measured["alltoall_inter"]["seconds_per_peer"]) == 3
    assert all(t > 0 for t in measured["alltoall_inter"]["seconds_per_peer"])
    assert set(measured["codecs"]) == {"fp16", "bf16", "fp8", "int8"}
    assert isinstance(calib, Calibration) and calib.source.startswith(
        "measured: embark-calibrate, gloo"
    )
    assert calib.intra_bandwidth == calib.inter_bandwidth > 0 and calib.lookup_bandwidth > 0
    assert Calibration.from_dict(calib.to_dict()) == calib
    assert (
        measured["alltoall_hierarchical"] is None and calib.hierarchical_inter_efficiency == 1.0
    )  # 1 rank per host
    assert (
        len(measured["unique_pooling"]) == len(measured["lookups"]) and calib.unique_pool_bandwidth
    )


def test_probes_module_does_not_shadow_the_package_exports() -> None:
    import lightning_embark.planner as planner
    from lightning_embark.planner._stats import measure

    assert (
        planner.measure is measure
    )  # a submodule named like an export would replace it once imported
