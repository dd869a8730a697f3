"""The headline suite's model rows and the strategies every row runs.

Which models run, how each is cut down to fit a 2-core machine (rows cap, per-rank batch),
which dense part sits on top (light for the comm-bound rows, so that the embedding exchange
is a large part of a step; MLPerf's full DLRM-DCNv2 for the compute-bound row), and the
bench's model argument for a row: the preset itself, or a one-width copy of it
(:func:`spec_for_bench`), since the bench DLRM's interaction needs one width.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

#: The light dense part of the comm-bound rows (docs/benchmarks.md, "a light dense part").
LIGHT = {"interaction": "dot", "dense_arch": "128", "over_arch": "128,64,1"}
#: The light dense part for T510: its dot interaction has 511 * 510 / 2 = 130k features, so a
#: 128-wide top MLP would hold 16.7M parameters (a DDP all-reduce of ~200 MB across hosts per
#: step, more than the embedding exchange); 16 wide keeps it at ~2M, like the others'.
LIGHT_WIDE = {"interaction": "dot", "dense_arch": "128", "over_arch": "16,1"}
#: MLPerf's full DLRM-DCNv2 dense part (the bench's defaults).
DCNV2 = {"interaction": "dcn", "dense_arch": "512,256", "over_arch": "1024,1024,512,256,1"}


@dataclass(frozen=True, kw_only=True)
class StrategyRun:
    """What one row label of the tables runs.

    Attributes:
        strategy: The ``embark-bench`` strategy.
        compressed: The automatic plan may use ``--allow``'s compressions.
        towers: ``embark-towers``' towers (``"auto"``: the planner decides whether and
            which; a row where it chooses none is a flat plan and says so); None: no towers.
    """

    strategy: str
    compressed: bool = False
    towers: str | None = None


#: Row labels and what each runs, references first. ``torchrec`` (torchrec's own planner)
#: and ``torchrec-fp16`` are what a torchrec user runs, both through
#: ``TrainPipelineSparseDist``; ``torchrec-twrw`` (every table table-row-wise) is the
#: EMBark paper's baseline, kept for that comparison.
STRATEGY_RUNS: dict[str, StrategyRun] = {
    "torchrec": StrategyRun(strategy="torchrec"),
    "torchrec-fp16": StrategyRun(strategy="torchrec-fp16"),
    "torchrec-twrw": StrategyRun(strategy="torchrec-twrw"),
    "embark": StrategyRun(strategy="embark"),
    "embark-compressed": StrategyRun(strategy="embark", compressed=True),
    "embark-towers-compressed": StrategyRun(
        strategy="embark-towers", compressed=True, towers="auto"
    ),
}

#: The reference each embark row is judged against (its verdict): the torchrec
#: configuration a user would run instead, lossless against lossless, compressed against
#: torchrec's fp16 qcomms.
REFERENCES: dict[str, str] = {
    "embark": "torchrec",
    "embark-compressed": "torchrec-fp16",
    "embark-towers-compressed": "torchrec-fp16",
}


@dataclass(frozen=True, kw_only=True)
class Workload:
    """One model row of the measured table: what runs and on which link.

    Attributes:
        key: Short name (``--models``, ``--rate-mbit KEY=...``, ``--batch-size KEY=...``).
        model: Preset name.
        title: The name in tables and figure.
        max_rows: Rows cap per table (communication volume does not depend on rows).
        batch_size: Per-rank batch, so that a step takes at most a few seconds on 2 cores.
        dense: ``interaction``, ``dense_arch`` and ``over_arch`` of the bench DLRM.
        regime: ``comm-bound`` (light dense part, piloted rate) or ``compute-bound``.
        pilot: Choose the link rate by a pilot of the reference (else ``DEFAULT_RATE_MBIT``).
    """

    key: str
    model: str
    title: str
    max_rows: int | None
    batch_size: int
    dense: dict[str, str]
    regime: str
    pilot: bool


#: A row of the tables below: key, preset, title, rows cap, batch / rank, dense part.
_Row = tuple[str, str, str, int | None, int, dict[str, str]]

_MLPERF = "mlperf-dlrm-dcnv2"

#: The comm-bound rows: a light dense part, and a link rate from a pilot, so that the
#: reference (``torchrec-fp16``, pipelined) has 30-50% of its step exposed in communication.
_COMM_BOUND: tuple[_Row, ...] = (
    ("mlperf", _MLPERF, "MLPerf DLRM-DCNv2", 100_000, 1024, LIGHT),
    ("t180", "hugectr-180table-70B-hotness80", "T180", 10_000, 128, LIGHT),
    ("t200", "hugectr-200table-100B-hotness20", "T200", 10_000, 128, LIGHT),
    ("t510", "hugectr-510table-110B-hotness5", "T510", 10_000, 128, LIGHT_WIDE),
)
#: The compute-bound row: MLPerf's full dense part at the emulation's default rate.
_COMPUTE_BOUND: tuple[_Row, ...] = (
    ("mlperf-dcnv2", _MLPERF, "MLPerf DLRM-DCNv2, full dense", 100_000, 512, DCNV2),
)


def _workload(row: _Row, *, regime: str, pilot: bool) -> Workload:
    """A table row as a :class:`Workload`, so that code past the tables reads named fields."""
    key, model, title, max_rows, batch_size, dense = row
    return Workload(
        key=key,
        model=model,
        title=title,
        max_rows=max_rows,
        batch_size=batch_size,
        dense=dense,
        regime=regime,
        pilot=pilot,
    )


WORKLOADS: tuple[Workload, ...] = (
    *(_workload(row, regime="comm-bound", pilot=True) for row in _COMM_BOUND),
    *(_workload(row, regime="compute-bound", pilot=False) for row in _COMPUTE_BOUND),
)

#: ``--quick``: one small model, every code path (pilot included) in a couple of minutes.
QUICK = _workload(
    ("demo", "demo-small", "demo-small", None, 256, LIGHT), regime="comm-bound", pilot=True
)


def uniform_width(dims: Sequence[int], multiple: int = 16) -> int:
    """One embedding width for a spec whose tables differ in width: the multiple of
    ``multiple`` nearest their mean, so that a sample's pooled bytes (the sum of the
    widths) stay about the same. The bench DLRM's interaction needs one width."""
    mean = sum(dims) / len(dims)
    return max(multiple, multiple * round(mean / multiple))


def spec_for_bench(workload: Workload, spec_dir: Path) -> tuple[str, int]:
    """The bench's model argument and its width: the preset itself when its tables share one
    width, else a copy with every table at :func:`uniform_width` (written to ``spec_dir``)."""
    text = (resources.files("lightning_embark") / "presets" / f"{workload.model}.json").read_text()
    data = json.loads(text)
    dims = [int(t["embedding_dim"]) for t in data["tables"]]
    if len(set(dims)) == 1:
        return workload.model, dims[0]
    width = uniform_width(dims)
    data["name"] = f"{data['name']}-w{width}"
    data["note"] = (
        f"{data.get('note', '')} headline.py: every table at width {width} (the spec's widths "
        f"{sorted(set(dims))}, mean {sum(dims) / len(dims):.1f}), for the bench DLRM's one-width "
        "interaction"
    ).strip()
    for table in data["tables"]:
        table["embedding_dim"] = width
    spec_dir.mkdir(parents=True, exist_ok=True)
    path = spec_dir / f"{data['name']}.json"
    path.write_text(json.dumps(data, indent=1))
    return str(path.resolve()), width
