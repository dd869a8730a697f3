"""Link probes on real gloo ranks: whole hierarchical exchanges on two hosts of two."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lightning_embark.calibration._link_probes import hierarchical_series
from lightning_embark.testing._ranks import run_gloo_ranks


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
