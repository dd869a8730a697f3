"""All of a calibration's measurements on real gloo ranks, fitted into a Calibration."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lightning_embark.calibration._from_measurements import build_calibration
from lightning_embark.calibration._probes import measure_all
from lightning_embark.errors import ConfigError
from lightning_embark.planner._hardware import Calibration
from lightning_embark.testing._ranks import run_gloo_ranks


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
