"""EMBark's headline evaluation side by side: measured on the emulated cluster, estimated at scale.

Runs MLPerf DLRM-DCNv2, T180, T200 and T510 (rows capped, synthetic data) on the emulated
2 hosts x 2 ranks cluster with five strategies: ``torchrec-twrw`` (every table
table-row-wise, EMBark's baseline), ``torchrec`` (torchrec's planner), ``torchrec-fp16``,
``embark`` (lossless) and ``embark-compressed`` (``embark`` whose automatic plan may use
``--allow``'s compressions). Every run uses the same dense exchange (``--dense-compression``).

The comm-bound rows use a light dense part (dot interaction, bottom MLP 128, top MLP
128-64-1; 16-1 for T510, whose 130k pairwise features would make a 128-wide top MLP the
biggest thing on the wire), so that the embedding exchange is a large part of a step, and a
link rate chosen per model by a pilot run of ``torchrec-twrw`` (:func:`pilot_rate`) so that
the baseline spends 25-50% of its step in embedding exchange, as on real clusters. T180
runs with every table at width 112 (:func:`uniform_width`): the bench DLRM needs one
width. One compute-bound row keeps MLPerf's full DLRM-DCNv2 dense part at the emulation's
default 800 Mbit/s.

Each model runs ``--repeats`` alternating paired repeats: repeat ``r`` runs the strategies
in an order rotated by ``r``, so slow drifts of the shared machine hit every strategy alike,
and ratios are taken within a repeat (paired) before their median.

A second table estimates the same strategies on ``dgx-h100`` at 8 x 8 and 16 x 8 ranks
with the calibrated cost model (embedding part only, as ``benchmarks/planner_quality.py``).

Writes ``headline.json``, ``headline.md`` and ``headline.png`` into ``--out-dir``; progress
(model, repeat, strategy) goes to stderr. Needs root for the emulated cluster (network
namespaces and ``tc``); without it the runs fall back to loopback and no rate is chosen.

    python benchmarks/headline.py --out-dir headline [--repeats 3] [--steps 10] \\
        [--models mlperf,t180,t200,t510,mlperf-dcnv2] [--rate-mbit t180=120 ...] \\
        [--batch-size t510=128 ...] [--allow fp16,bf16] [--dense-compression fp32] \\
        [--torchrec-timeout 120] [--no-estimates] [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import functools
import json
import logging
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

#: The emulation's accepted link rates (``EmulationConfig.rate_mbit``: 0.001..1,000,000).
RATE_MIN_MBIT = 0.001
RATE_MAX_MBIT = 1_000_000.0
#: The default link rate of the emulation (``lightning_embark.emulation.DEFAULT_RATE_MBIT``).
DEFAULT_RATE_MBIT = 800.0
#: The share of ``torchrec-twrw``'s step the pilot aims its rate at (the middle of 25-50%).
TARGET_SHARE = 0.375
#: The band the measured baseline share should land in.
SHARE_BAND = (0.25, 0.50)

#: The light dense part of the comm-bound rows (docs/benchmarks.md, "a light dense part").
LIGHT = {"interaction": "dot", "dense_arch": "128", "over_arch": "128,64,1"}
#: The light dense part for T510: its dot interaction has 511 * 510 / 2 = 130k features, so a
#: 128-wide top MLP would hold 16.7M parameters (a DDP all-reduce of ~200 MB across hosts per
#: step, more than the embedding exchange); 16 wide keeps it at ~2M, like the others'.
LIGHT_WIDE = {"interaction": "dot", "dense_arch": "128", "over_arch": "16,1"}
#: MLPerf's full DLRM-DCNv2 dense part (the bench's defaults).
DCNV2 = {"interaction": "dcn", "dense_arch": "512,256", "over_arch": "1024,1024,512,256,1"}

#: Row labels, the strategy each runs and whether it takes ``--allow``.
STRATEGY_RUNS: dict[str, tuple[str, bool]] = {
    "torchrec-twrw": ("torchrec-twrw", False),
    "torchrec": ("torchrec", False),
    "torchrec-fp16": ("torchrec-fp16", False),
    "embark": ("embark", False),
    "embark-compressed": ("embark", True),
}
#: The rows every other row is compared with, per repeat.
BASELINES = ("torchrec-twrw", "torchrec-fp16")


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
        pilot: Choose the link rate by a pilot run (else ``DEFAULT_RATE_MBIT``).
    """

    key: str
    model: str
    title: str
    max_rows: int | None
    batch_size: int
    dense: dict[str, str]
    regime: str
    pilot: bool


WORKLOADS: tuple[Workload, ...] = (
    Workload(
        key="mlperf",
        model="mlperf-dlrm-dcnv2",
        title="MLPerf DLRM-DCNv2",
        max_rows=100_000,
        batch_size=1024,
        dense=LIGHT,
        regime="comm-bound",
        pilot=True,
    ),
    Workload(
        key="t180",
        model="hugectr-180table-70B-hotness80",
        title="T180",
        max_rows=10_000,
        batch_size=128,
        dense=LIGHT,
        regime="comm-bound",
        pilot=True,
    ),
    Workload(
        key="t200",
        model="hugectr-200table-100B-hotness20",
        title="T200",
        max_rows=10_000,
        batch_size=128,
        dense=LIGHT,
        regime="comm-bound",
        pilot=True,
    ),
    Workload(
        key="t510",
        model="hugectr-510table-110B-hotness5",
        title="T510",
        max_rows=10_000,
        batch_size=128,
        dense=LIGHT_WIDE,
        regime="comm-bound",
        pilot=True,
    ),
    Workload(
        key="mlperf-dcnv2",
        model="mlperf-dlrm-dcnv2",
        title="MLPerf DLRM-DCNv2, full dense",
        max_rows=100_000,
        batch_size=512,
        dense=DCNV2,
        regime="compute-bound",
        pilot=False,
    ),
)

#: ``--quick``: one small model, every code path (pilot included) in a couple of minutes.
QUICK = Workload(
    key="demo",
    model="demo-small",
    title="demo-small",
    max_rows=None,
    batch_size=256,
    dense=LIGHT,
    regime="comm-bound",
    pilot=True,
)


def log(message: str) -> None:
    """Progress on stderr (stdout carries the tables)."""
    print(f"[headline] {message}", file=sys.stderr, flush=True)


# --- pure logic -----------------------------------------------------------------------


def pilot_rate(
    rate_mbit: float,
    share: float,
    *,
    target: float = TARGET_SHARE,
    low: float = RATE_MIN_MBIT,
    high: float = RATE_MAX_MBIT,
) -> float:
    """The link rate at which the baseline should spend ``target`` of its step in exchange.

    Model: a step of ``T`` at rate ``r`` spends ``E = s T`` in the embedding exchange, whose
    time scales as ``1 / rate``, and ``C = (1 - s) T`` in everything else, which does not
    depend on the rate. The share is ``target`` when ``E* = target / (1 - target) * C``, at
    rate ``r* = r E / E*``::

        r* = r * s * (1 - target) / (target * (1 - s))

    clamped to ``[low, high]`` (the emulation's range). ``s >= 1`` (nothing but exchange)
    gives ``high``: no finite rate leaves room for anything else.

    Raises:
        ValueError: ``share <= 0`` (no exchange measured: no rate can set its share) or a
            ``target`` outside ``(0, 1)``.
    """
    if not 0 < target < 1:
        raise ValueError(f"target share must be within (0, 1), got {target}")
    if share <= 0:
        raise ValueError(
            f"the pilot measured an exchange share of {share}; no link rate scales a zero "
            "exchange: give the rate with --rate-mbit MODEL=RATE"
        )
    if share >= 1:
        return high
    chosen = rate_mbit * share * (1 - target) / (target * (1 - share))
    return min(high, max(low, chosen))


def rotated(items: Sequence[str], repeat: int) -> list[str]:
    """``items`` rotated left by ``repeat``: repeat ``r`` starts with item ``r mod n``, so
    over ``n`` repeats every strategy runs once in every position."""
    if not items:
        return []
    k = repeat % len(items)
    return [*items[k:], *items[:k]]


def quantile(values: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default): position ``q (n - 1)`` of the
    sorted values."""
    if not values:
        raise ValueError("quantile of no values")
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def inter_host_mb(run: dict[str, Any]) -> tuple[float, float]:
    """Inter-host MB per step (summed over ranks) of a run's embedding part and of its dense
    gradients (``bytes_per_step``: ``embedding_inter_host`` and ``by_traffic["dense"]``)."""
    per_step = run["bytes_per_step"]
    dense = per_step.get("by_traffic", {}).get("dense", {}).get("inter_host", 0)
    embedding = per_step.get("embedding_inter_host", per_step["inter_host"] - dense)
    return embedding / 1e6, dense / 1e6


def aggregate(
    repeats: Sequence[dict[str, dict[str, Any]]],
    labels: Sequence[str],
    baselines: Sequence[str] = BASELINES,
) -> dict[str, dict[str, Any]]:
    """Per row: step time over repeats and the paired ratios against each baseline.

    A run's step time is its median over measured steps (the slowest rank's per step). Per
    row: the median over repeats of those medians, with p10 and p90 across the repeats'
    medians (:func:`quantile`). The ratio to a baseline ``b`` is taken within each repeat,
    ``T_row,r / T_b,r`` (both ran back to back, paired), then its median over repeats. The
    exchange share and the inter-host MB are medians over repeats too (bytes repeat exactly).
    """
    out: dict[str, dict[str, Any]] = {}
    for label in labels:
        steps = [rep[label]["step_time_ms"]["median"] for rep in repeats]
        ratios: dict[str, dict[str, Any]] = {}
        for base in baselines:
            if base not in labels:
                continue
            paired = [
                rep[label]["step_time_ms"]["median"] / rep[base]["step_time_ms"]["median"]
                for rep in repeats
            ]
            ratios[base] = {"median": statistics.median(paired), "per_repeat": paired}
        mb = [inter_host_mb(rep[label]) for rep in repeats]
        out[label] = {
            "step_ms": {
                "median": statistics.median(steps),
                "p10": quantile(steps, 0.1),
                "p90": quantile(steps, 0.9),
                "per_repeat": steps,
            },
            "ratio": ratios,
            "comm_share": statistics.median(rep[label]["comm_share"] for rep in repeats),
            "embedding_inter_mb": statistics.median(e for e, _ in mb),
            "dense_inter_mb": statistics.median(d for _, d in mb),
            "dense_compression": "/".join(
                sorted({str(rep[label].get("dense_compression", "?")) for rep in repeats})
            ),
            "dense_exchange": "/".join(
                sorted({str(rep[label].get("dense_exchange", "?")) for rep in repeats})
            ),
            "num_repeats": len(repeats),
        }
    return out


def dense_wire_ms(dense_inter_bytes: float, *, num_hosts: int, rate_mbit: float | None) -> float:
    """Time the dense gradients' inter-host bytes take on the shaped link, in ms.

    ``dense_inter_bytes`` is summed over ranks (what every rank sends across hosts); each
    host's link carries its own ranks' share, ``bytes / num_hosts`` (hosts are symmetric),
    at ``rate`` Mbit/s per direction::

        t = (bytes / num_hosts) * 8 / (rate * 1e6)[s]

    Unshaped (``rate`` None: loopback) gives 0: there is no link rate to derive it from.
    """
    if rate_mbit is None or rate_mbit <= 0 or num_hosts < 2:
        return 0.0
    return 1e3 * (dense_inter_bytes / num_hosts) * 8 / (rate_mbit * 1e6)


def stack_split(step_ms: float, comm_share: float, dense_ms: float) -> tuple[float, float, float]:
    """A step's ``(compute, embedding exchange, dense exchange)`` ms for the figure.

    Embedding exchange ``E = share * T`` (the measured share of a step blocked in embedding
    all-to-alls); dense exchange ``D = min(dense_ms, T - E)`` (its wire time,
    :func:`dense_wire_ms`, at most what is left); compute ``C = T - E - D``, everything
    else. The three add up to ``T``.
    """
    share = min(1.0, max(0.0, comm_share))
    embedding = share * step_ms
    dense = min(max(0.0, dense_ms), step_ms - embedding)
    return step_ms - embedding - dense, embedding, dense


def uniform_width(dims: Sequence[int], multiple: int = 16) -> int:
    """One embedding width for a spec whose tables differ in width: the multiple of
    ``multiple`` nearest their mean, so that a sample's pooled bytes (the sum of the
    widths) stay about the same. The bench DLRM's interaction needs one width."""
    mean = sum(dims) / len(dims)
    return max(multiple, multiple * round(mean / multiple))


def parse_overrides(items: Sequence[str], keys: Sequence[str], what: str) -> dict[str, float]:
    """``KEY=VALUE`` options (``--rate-mbit t180=120``) as a dict, keys checked."""
    out: dict[str, float] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or key not in keys:
            raise ValueError(f"{what} {item!r}: give KEY=VALUE with KEY one of {list(keys)}")
        try:
            out[key] = float(value)
        except ValueError:
            raise ValueError(f"{what} {item!r}: {value!r} is not a number") from None
        if out[key] <= 0:
            raise ValueError(f"{what} {item!r}: must be positive")
    return out


def condense_plan_summary(text: str) -> list[str]:
    """A plan summary's header lines plus, instead of one line per table, a count per
    layout (``table_row_wise (fused) x 177``): hundreds of tables per run would swamp the
    JSON. A table line is indented, ``name: layout ranks=...``; its ranks are dropped."""
    headers: list[str] = []
    counts: dict[str, int] = {}
    for line in text.splitlines():
        if line.startswith((" ", "\t")) and ": " in line:
            layout = re.sub(r"\s*ranks=.*$", "", line.split(": ", 1)[1]).strip()
            counts[layout] = counts.get(layout, 0) + 1
        elif line.strip():
            headers.append(line.strip())
    return headers + [f"{layout} x {n}" for layout, n in counts.items()]


def _fmt_ratio(summary: dict[str, Any], base: str) -> str:
    ratio = summary["ratio"].get(base)
    return "" if ratio is None else f"{ratio['median']:.2f}"


def format_workloads_table(workloads: Sequence[dict[str, Any]]) -> str:
    """Markdown: each model row's spec, batch, dense part and link rate (and its source)."""
    lines = [
        "| row | model | regime | rows cap | width | batch / rank | dense part | link Mbit/s "
        "| rate from |",
        "|---|---|---|---:|---|---:|---|---:|---|",
    ]
    for w in workloads:
        dense = w["dense"]
        arch = f"{dense['interaction']}, bottom {dense['dense_arch']}, top {dense['over_arch']}"
        rate = "-" if w["rate_mbit"] is None else f"{w['rate_mbit']:.4g}"
        lines.append(
            f"| {w['key']} | {w['model']} | {w['regime']} | "
            f"{w['max_rows'] if w['max_rows'] is not None else '-'} | {w['width']} | "
            f"{w['batch_size']} | {arch} | {rate} | {w['rate_source']} |"
        )
    return "\n".join(lines)


def format_measured_table(workloads: Sequence[dict[str, Any]], labels: Sequence[str]) -> str:
    """Markdown: per model and strategy, step time, paired ratios, share and MB/step."""
    lines = [
        "| model | link Mbit/s | strategy | step ms | p10-p90 ms | x twrw | x fp16 "
        "| emb. exchange share | emb. inter MB/step | dense inter MB/step | dense wire |",
        "|---|---:|---|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    for w in workloads:
        rate = "-" if w["rate_mbit"] is None else f"{w['rate_mbit']:.4g}"
        for label in labels:
            s = w["summary"][label]
            step = s["step_ms"]
            lines.append(
                f"| {w['title']} | {rate} | {label} | {step['median']:.1f} | "
                f"{step['p10']:.1f}-{step['p90']:.1f} | {_fmt_ratio(s, 'torchrec-twrw')} | "
                f"{_fmt_ratio(s, 'torchrec-fp16')} | {s['comm_share']:.0%} | "
                f"{s['embedding_inter_mb']:.2f} | {s['dense_inter_mb']:.2f} | "
                f"{s['dense_compression']} {s.get('dense_exchange', '')} |"
            )
    return "\n".join(lines)


def format_estimate_table(rows: Sequence[dict[str, Any]], labels: Sequence[str]) -> str:
    """Markdown: the cost model's estimated step per model, cluster and strategy."""
    lines = [
        "| model | cluster | strategy | estimate ms | x twrw | x fp16 | note |",
        "|---|---|---|---:|---:|---:|---|",
    ]
    for row in rows:
        est = row["strategies"]
        for label in labels:
            if label not in est:
                continue
            ms = est[label]["step_ms"]
            twrw = est.get("torchrec-twrw", {}).get("step_ms")
            fp16 = est.get("torchrec-fp16", {}).get("step_ms")
            x_twrw = f"{ms / twrw:.2f}" if twrw else ""
            x_fp16 = f"{ms / fp16:.2f}" if fp16 else ""
            lines.append(
                f"| {row['model']} | {row['hosts']} x {row['ranks_per_host']} | {label} | "
                f"{ms:.2f} | {x_twrw} | {x_fp16} | {est[label].get('note', '')} |"
            )
    return "\n".join(lines)


# --- measured runs --------------------------------------------------------------------


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


@dataclass(frozen=True, kw_only=True)
class RunSettings:
    """What every measured run of the suite shares."""

    steps: int
    warmup: int
    allow: tuple[str, ...]
    dense_compression: str
    loopback: bool
    seed: int
    pipeline: bool = True


def run_one(
    workload: Workload,
    model: str,
    label: str,
    *,
    rate_mbit: float | None,
    settings: RunSettings,
    steps: int | None = None,
    warmup: int | None = None,
) -> dict[str, Any]:
    """One strategy's run on a fresh emulated cluster (``run_benchmark`` with one strategy),
    its ``runs[0]`` relabelled, with the rate it crossed, the cluster mode and the dense
    all-reduce's blocked ms (from the rank records)."""
    from lightning_embark.harness import BenchConfig, run_benchmark

    strategy, compressed = STRATEGY_RUNS[label]
    config = BenchConfig(
        model=model,
        max_rows=workload.max_rows,
        batch_size=workload.batch_size,
        steps=steps or settings.steps,
        warmup=settings.warmup if warmup is None else warmup,
        strategies=(strategy,),
        rate_mbit=rate_mbit,
        seed=settings.seed,
        loopback=settings.loopback,
        allow=settings.allow if compressed else (),
        dense_compression=settings.dense_compression,
        interaction=workload.dense["interaction"],
        dense_arch=workload.dense["dense_arch"],
        over_arch=workload.dense["over_arch"],
        pipeline=settings.pipeline,
    )
    with tempfile.TemporaryDirectory(prefix="headline-") as tmp:
        result = run_benchmark(config, work_dir=Path(tmp))
        records = _rank_records(Path(tmp) / strategy)
    (run,) = result["runs"]
    run.pop("plan", None)  # the whole plan: large; the condensed summary says what it was
    if "plan_summary" in run:
        run["plan_summary"] = condense_plan_summary(run["plan_summary"])
    run["strategy"] = label
    run["rate_mbit"] = result["config"]["rate_mbit"]
    run["cluster_mode"] = result["config"]["cluster"]["mode"]
    run["spec"] = result["config"]["spec"]
    run["dense_blocked_ms"] = _dense_blocked_ms(records, config.warmup)
    return run


def _rank_records(folder: Path) -> list[dict[str, Any]]:
    from lightning_embark.errors import EmbarkError
    from lightning_embark.harness import load_rank_records

    try:  # a missing side figure must not lose the run
        return load_rank_records(folder)
    except (EmbarkError, OSError, ValueError):
        return []


def _dense_blocked_ms(records: list[dict[str, Any]], warmup: int) -> float | None:
    """Median over measured steps of the slowest rank's ms blocked in ``dense``-labelled
    collectives. Not the dense exchange's exposed time: DDP's all-reduce (torchrec) waits in
    C++, unseen, and embark's host-aware one blocks a background thread during backward;
    kept in the JSON as a side figure."""
    if not records:
        return None
    steps = min(len(r["comm"]) for r in records)
    values = [
        max(
            r["comm"][i].get("by_traffic", {}).get("dense", {}).get("blocked_seconds", 0.0)
            for r in records
        )
        for i in range(warmup, steps)
    ]
    return 1e3 * statistics.median(values) if values else None


def choose_rate(
    workload: Workload,
    model: str,
    *,
    override: float | None,
    start_rate: float,
    pilot_steps: int,
    pilot_warmup: int,
    target: float,
    settings: RunSettings,
    runner: Callable[..., dict[str, Any]] = run_one,
) -> tuple[float | None, str, dict[str, Any] | None]:
    """The workload's link rate, where it came from, and the pilot's record (if one ran).

    ``--rate-mbit`` overrides; the compute-bound row keeps the default rate; a comm-bound
    row runs ``torchrec-twrw`` briefly at ``start_rate`` and takes :func:`pilot_rate` of
    its measured share. On loopback there is no rate to choose.
    """
    if settings.loopback:
        return None, "loopback: no shaped link", None
    if override is not None:
        return override, "--rate-mbit", None
    if not workload.pilot:
        return DEFAULT_RATE_MBIT, "default (compute-bound row)", None
    log(f"{workload.key}: pilot torchrec-twrw at {start_rate:g} Mbit/s")
    run = runner(
        workload,
        model,
        "torchrec-twrw",
        rate_mbit=start_rate,
        settings=settings,
        steps=pilot_steps,
        warmup=pilot_warmup,
    )
    pilot: dict[str, Any] = {
        "start_rate_mbit": start_rate,
        "share": run["comm_share"],
        "step_ms": run["step_time_ms"]["median"],
        "target": target,
        "steps": pilot_steps,
        "warmup": pilot_warmup,
    }
    if run["rate_mbit"] is None:
        log(f"{workload.key}: the pilot ran on loopback (no namespaces); no rate to choose")
        pilot["rate_mbit"] = None
        return None, "loopback fallback: no shaped link", pilot
    try:
        rate = pilot_rate(start_rate, run["comm_share"], target=target)
    except ValueError as error:
        log(f"{workload.key}: {error}; keeping {start_rate:g} Mbit/s")
        pilot["rate_mbit"] = start_rate
        return start_rate, "pilot (zero share: start rate kept)", pilot
    pilot["rate_mbit"] = rate
    log(
        f"{workload.key}: pilot share {run['comm_share']:.0%} at {start_rate:g} Mbit/s "
        f"-> {rate:.4g} Mbit/s for {target:.1%}"
    )
    return rate, f"pilot: {run['comm_share']:.0%} at {start_rate:g}", pilot


def measure_workload(
    workload: Workload,
    labels: Sequence[str],
    *,
    repeats: int,
    rate_override: float | None,
    start_rate: float,
    pilot_steps: int,
    pilot_warmup: int,
    target: float,
    settings: RunSettings,
    spec_dir: Path,
    runner: Callable[..., dict[str, Any]] = run_one,
) -> dict[str, Any]:
    """Pilot (if any), then ``repeats`` alternating paired repeats of every strategy."""
    model, width = spec_for_bench(workload, spec_dir)
    rate, source, pilot = choose_rate(
        workload,
        model,
        override=rate_override,
        start_rate=start_rate,
        pilot_steps=pilot_steps,
        pilot_warmup=pilot_warmup,
        target=target,
        settings=settings,
        runner=runner,
    )
    runs: list[dict[str, dict[str, Any]]] = []
    for r in range(repeats):
        order = rotated(labels, r)
        runs_r: dict[str, dict[str, Any]] = {}
        for i, label in enumerate(order, start=1):
            at = "loopback" if rate is None else f"{rate:.4g} Mbit/s"
            log(f"{workload.key} repeat {r + 1}/{repeats} run {i}/{len(order)}: {label} ({at})")
            runs_r[label] = runner(workload, model, label, rate_mbit=rate, settings=settings)
        runs.append(runs_r)
    summary = aggregate(runs, labels)
    if "torchrec-twrw" in summary:
        share = summary["torchrec-twrw"]["comm_share"]
        low, high = SHARE_BAND
        if rate is not None and workload.pilot and not low <= share <= high:
            log(f"{workload.key}: torchrec-twrw's measured share {share:.0%} is outside 25-50%")
    # The rate every run crossed: a loopback fallback (no namespaces) has none.
    applied = {run["rate_mbit"] for rep in runs for run in rep.values()}
    if applied != {rate}:
        log(
            f"{workload.key}: runs crossed {sorted(map(str, applied))}, not {rate}; reporting that"
        )
        rate = applied.pop() if len(applied) == 1 else None
    return {
        "key": workload.key,
        "model": workload.model,
        "bench_model": model,
        "title": workload.title,
        "regime": workload.regime,
        "max_rows": workload.max_rows,
        "width": width,
        "batch_size": workload.batch_size,
        "dense": dict(workload.dense),
        "rate_mbit": rate,
        "rate_source": source,
        "pilot": pilot,
        "order": [rotated(labels, r) for r in range(repeats)],
        "repeats": runs,
        "summary": summary,
    }


# --- estimates at scale ---------------------------------------------------------------


def _with_compression(plan: Any, compression: str) -> Any:
    """``plan`` with every exchanged (non-DP) cluster's forward and backward wire at
    ``compression``: torchrec's plan under ``qcomms`` (both directions, as
    ``qcomms_config`` sets them)."""
    from lightning_embark.plan import ClusterType

    clusters = tuple(
        c
        if c.type is ClusterType.DP
        else dataclasses.replace(
            c, forward_compression=compression, backward_compression=compression
        )
        for c in plan.clusters
    )
    return dataclasses.replace(plan, clusters=clusters)


def _torchrec_plan(
    spec: Any,
    *,
    hosts: int,
    ranks_per_host: int,
    batch_size: int,
    topology: Any,
    timeout: int | None,
    sharding_types: Sequence[str] | None,
) -> tuple[Any, bool]:
    """torchrec's planner's plan as ours, and whether its search was cut at ``timeout``.

    With ``sharding_types`` every table is limited to them (``torchrec-twrw``: the
    constraints ``TorchrecStrategy`` gives torchrec's planner); without, it is
    ``planner_quality.py``'s plan.
    """
    from lightning_embark.baseline import plan_from_torchrec, torchrec_plan

    planning = torchrec_plan(
        spec,
        num_hosts=hosts,
        ranks_per_host=ranks_per_host,
        batch_size=batch_size,
        topology=topology,
        timeout_seconds=timeout,
        sharding_types=sharding_types,
    )
    sharding, cut = planning.plan, planning.timed_out
    plan = plan_from_torchrec(
        sharding, spec, world_size=hosts * ranks_per_host, ranks_per_host=ranks_per_host
    )
    return plan, cut


def estimate_rows(
    models: Sequence[str],
    hosts_list: Sequence[int],
    *,
    labels: Sequence[str],
    ranks_per_host: int,
    batch_size: int,
    topology_name: str,
    allow: Sequence[str],
    timeout: int | None,
) -> list[dict[str, Any]]:
    """Every strategy's estimated step per model and cluster under one :class:`CostModel`.

    ``torchrec-twrw``: torchrec's planner limited to table-row-wise; ``torchrec``: its
    default planner (cut at ``timeout`` s, as ``planner_quality.py``); ``torchrec-fp16``:
    that plan with fp16 wires; ``embark``: the greedy plan, lossless; ``embark-compressed``:
    the greedy plan allowed ``allow``. The original presets (mixed widths kept). The cost
    model prices the embedding part only (lookups, codecs, exchanges, DP all-reduce).
    """
    from lightning_embark.plan import Compression
    from lightning_embark.planner import CostModel, GreedyConfig, GreedyPlanner, load_calibration
    from lightning_embark.spec import load_spec

    logging.getLogger("torchrec").setLevel(logging.ERROR)
    logging.getLogger().setLevel(logging.ERROR)  # torchrec warns on the root logger per DP table
    calib = load_calibration(topology_name)
    rows = []
    for name in models:
        spec = load_spec(name)
        for hosts in hosts_list:
            log(f"estimate {name} on {hosts} x {ranks_per_host} {topology_name}")
            model = CostModel(
                spec, calib, num_hosts=hosts, ranks_per_host=ranks_per_host, batch_size=batch_size
            )
            topology = calib.topology(num_hosts=hosts, ranks_per_host=ranks_per_host)
            est: dict[str, dict[str, Any]] = {}
            plan_torchrec = functools.partial(
                _torchrec_plan,
                spec,
                hosts=hosts,
                ranks_per_host=ranks_per_host,
                batch_size=batch_size,
                topology=topology,
                timeout=timeout,
            )
            cut_note = f"torchrec's search cut at {timeout} s"
            if "torchrec-twrw" in labels:
                plan, cut = plan_torchrec(sharding_types=("table_row_wise",))
                est["torchrec-twrw"] = {
                    "step_ms": model.estimate(plan).step_time_ms,
                    "note": cut_note if cut else "",
                }
            if {"torchrec", "torchrec-fp16"} & set(labels):
                torchrec_plan, cut = plan_torchrec(sharding_types=None)
                note = cut_note if cut else ""
                if "torchrec" in labels:
                    est["torchrec"] = {
                        "step_ms": model.estimate(torchrec_plan).step_time_ms,
                        "note": note,
                    }
                if "torchrec-fp16" in labels:
                    fp16 = _with_compression(torchrec_plan, "fp16")
                    est["torchrec-fp16"] = {
                        "step_ms": model.estimate(fp16).step_time_ms,
                        "note": (note + "; " if note else "") + "torchrec's plan, fp16 wires",
                    }
            if "embark" in labels:
                ours = GreedyPlanner().plan(model)
                est["embark"] = {"step_ms": ours.estimate.step_time_ms, "note": "lossless"}
            if "embark-compressed" in labels:
                allowed = tuple(Compression(c) for c in ("fp32", *allow))
                ours = GreedyPlanner(GreedyConfig(allow=allowed)).plan(model)
                est["embark-compressed"] = {
                    "step_ms": ours.estimate.step_time_ms,
                    "note": "allow " + ",".join(allow),
                }
            rows.append(
                {
                    "model": name,
                    "hosts": hosts,
                    "ranks_per_host": ranks_per_host,
                    "batch_size": batch_size,
                    "strategies": est,
                }
            )
    return rows


# --- figure ---------------------------------------------------------------------------

#: Stack colours: compute, embedding exchange, dense exchange.
STACK_COLORS = ("tab:gray", "tab:blue", "tab:orange")

FIGURE_CAPTION = (
    "Median step time over repeats, stacked. Embedding exchange: the measured median share of "
    "a step blocked in embedding all-to-alls, times the step. Dense exchange: derived, not "
    "measured: the dense gradients' inter-host bytes per host over the shaped link rate (wire "
    "time at full rate; DDP and embark's all-reduce overlap it with backward, so the exposed "
    "part may be smaller). Compute: the rest of the step."
)


def stacks(workload: dict[str, Any], labels: Sequence[str]) -> list[tuple[float, float, float]]:
    """Each strategy's :func:`stack_split` for one measured workload."""
    out = []
    for label in labels:
        s = workload["summary"][label]
        dense = dense_wire_ms(
            s["dense_inter_mb"] * 1e6, num_hosts=2, rate_mbit=workload["rate_mbit"]
        )
        out.append(stack_split(s["step_ms"]["median"], s["comm_share"], dense))
    return out


def plot_headline(workloads: Sequence[dict[str, Any]], labels: Sequence[str], path: Path) -> None:
    """One panel per model (its own y scale: the compute-bound row is ~10x longer), one bar
    per strategy stacked compute / embedding exchange / dense exchange."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(3.2 * max(1, len(workloads)) + 1, 5.2))
    axes = fig.subplots(1, max(1, len(workloads)), squeeze=False)[0]
    parts = ("compute", "embedding exchange", "dense exchange (derived)")
    for ax, w in zip(axes, workloads, strict=False):
        bottoms = [0.0] * len(labels)
        for k, (part, color) in enumerate(zip(parts, STACK_COLORS, strict=True)):
            heights = [split[k] for split in stacks(w, labels)]
            ax.bar(range(len(labels)), heights, bottom=bottoms, color=color, label=part)
            bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
        rate = "loopback" if w["rate_mbit"] is None else f"{w['rate_mbit']:.4g} Mbit/s"
        ax.set_title(f"{w['title']}\n{rate}, batch {w['batch_size']}/rank", fontsize=9)
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(labels, rotation=45, ha="right", fontsize=8)
        ax.set_ylabel("step ms")
    axes[0].legend(fontsize=7)
    fig.text(0.01, 0.005, FIGURE_CAPTION, fontsize=6.5, wrap=True, va="bottom")
    fig.tight_layout(rect=(0, 0.09, 1, 1))
    fig.savefig(path, dpi=120)


# --- command line ---------------------------------------------------------------------


def _commit() -> str | None:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).resolve().parent,
        )
        return out.stdout.strip() or None
    return None


def build_parser() -> argparse.ArgumentParser:
    keys = [w.key for w in WORKLOADS]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", type=Path, default=Path("headline"))
    parser.add_argument(
        "--models", default=",".join(keys), help=f"comma-separated rows, of {keys}"
    )
    parser.add_argument("--strategies", default=",".join(STRATEGY_RUNS))
    parser.add_argument("--repeats", type=int, default=3, help="alternating paired repeats")
    parser.add_argument("--steps", type=int, default=10, help="measured steps per run")
    parser.add_argument("--warmup", type=int, default=3, help="unmeasured steps per run")
    parser.add_argument("--pilot-steps", type=int, default=5)
    parser.add_argument("--pilot-warmup", type=int, default=2)
    parser.add_argument("--start-rate-mbit", type=float, default=DEFAULT_RATE_MBIT)
    parser.add_argument("--target-share", type=float, default=TARGET_SHARE)
    parser.add_argument(
        "--rate-mbit",
        action="append",
        default=[],
        metavar="ROW=RATE",
        help="the row's link rate, skipping its pilot (repeatable)",
    )
    parser.add_argument(
        "--batch-size",
        action="append",
        default=[],
        metavar="ROW=N",
        help="the row's per-rank batch (repeatable)",
    )
    parser.add_argument(
        "--allow",
        default="fp16,bf16",
        help="embark-compressed's compressions (fp8 and int8 also kept AUC within 0.005 on "
        "the Criteo sample, docs/benchmarks.md#accuracy-with-compression)",
    )
    parser.add_argument(
        "--dense-compression",
        choices=("fp32", "bf16", "fp16"),
        default="fp32",
        help="every run's dense-gradient wire format",
    )
    parser.add_argument("--loopback", action="store_true", help="no emulation, no shaped link")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--estimate-hosts", default="8,16", help="hosts of the estimate table")
    parser.add_argument("--estimate-ranks-per-host", type=int, default=8)
    parser.add_argument("--estimate-batch", type=int, default=4096)
    parser.add_argument("--topology", default="dgx-h100")
    parser.add_argument(
        "--torchrec-timeout",
        type=int,
        default=120,
        metavar="SECONDS",
        help="torchrec's search budget per estimated plan (planner_quality.py uses 600)",
    )
    parser.add_argument(
        "--no-pipeline",
        action="store_true",
        help="runs without their strategy's input pipeline (default: torchrec's "
        "TrainPipelineSparseDist for the torchrec rows, embark's IDs a step ahead)",
    )
    parser.add_argument("--no-estimates", action="store_true")
    parser.add_argument("--estimates-only", action="store_true")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="demo-small, 1 repeat, 3 steps, estimates at 8 x 8 only (a smoke run)",
    )
    return parser


def main(argv: list[str] | None = None, *, runner: Callable[..., dict[str, Any]] = run_one) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    keys = [w.key for w in WORKLOADS]
    labels = [s.strip() for s in args.strategies.split(",") if s.strip()]
    if bad := [s for s in labels if s not in STRATEGY_RUNS]:
        parser.error(f"--strategies {bad}: choose from {list(STRATEGY_RUNS)}")
    allow = tuple(a.strip() for a in args.allow.split(",") if a.strip())
    if args.quick:
        workloads = [QUICK]
        args.repeats, args.steps, args.warmup = 1, 3, 1
        args.pilot_steps, args.pilot_warmup = 3, 1
        args.estimate_hosts, args.torchrec_timeout = "8", 10
        keys = [QUICK.key]
    else:
        chosen = [m.strip() for m in args.models.split(",") if m.strip()]
        if bad := [m for m in chosen if m not in keys]:
            parser.error(f"--models {bad}: choose from {keys}")
        workloads = [w for w in WORKLOADS if w.key in chosen]
    try:
        rates = parse_overrides(args.rate_mbit, keys, "--rate-mbit")
        batches = parse_overrides(args.batch_size, keys, "--batch-size")
        hosts_list = [int(h) for h in args.estimate_hosts.split(",") if h.strip()]
    except ValueError as error:
        parser.error(str(error))
    if args.repeats < 1 or args.steps < 1 or args.warmup < 0:
        parser.error("--repeats and --steps must be >= 1, --warmup >= 0")
    workloads = [
        dataclasses.replace(w, batch_size=int(batches[w.key])) if w.key in batches else w
        for w in workloads
    ]
    settings = RunSettings(
        steps=args.steps,
        warmup=args.warmup,
        allow=allow,
        dense_compression=args.dense_compression,
        loopback=args.loopback,
        seed=args.seed,
        pipeline=not args.no_pipeline,
    )
    args.out_dir.mkdir(parents=True, exist_ok=True)
    command = shlex.join(
        [Path(sys.argv[0]).name if argv is None else "headline.py", *(argv or sys.argv[1:])]
    )
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    measured = []
    if not args.estimates_only:
        for w in workloads:
            measured.append(
                measure_workload(
                    w,
                    labels,
                    repeats=args.repeats,
                    rate_override=rates.get(w.key),
                    start_rate=args.start_rate_mbit,
                    pilot_steps=args.pilot_steps,
                    pilot_warmup=args.pilot_warmup,
                    target=args.target_share,
                    settings=settings,
                    spec_dir=args.out_dir / "specs",
                    runner=runner,
                )
            )
    estimates: list[dict[str, Any]] = []
    if not args.no_estimates:
        models = list(dict.fromkeys(w.model for w in workloads))
        estimates = estimate_rows(
            models,
            hosts_list,
            labels=labels,
            ranks_per_host=args.estimate_ranks_per_host,
            batch_size=args.estimate_batch,
            topology_name=args.topology,
            allow=allow,
            timeout=args.torchrec_timeout or None,
        )
    markdown = render_markdown(
        command=command,
        date=date,
        commit=_commit(),
        measured=measured,
        estimates=estimates,
        labels=labels,
        settings=settings,
        repeats=args.repeats,
        topology=args.topology,
    )
    (args.out_dir / "headline.md").write_text(markdown)
    print(markdown)
    if measured:
        plot_headline(measured, labels, args.out_dir / "headline.png")
    doc = {
        "command": command,
        "date": date,
        "commit": _commit(),
        "settings": dataclasses.asdict(settings) | {"repeats": args.repeats},
        "target_share": args.target_share,
        "labels": labels,
        "workloads": measured,
        "estimates": estimates,
        "estimate_settings": {
            "topology": args.topology,
            "hosts": hosts_list,
            "ranks_per_host": args.estimate_ranks_per_host,
            "batch_size": args.estimate_batch,
            "torchrec_timeout_s": args.torchrec_timeout,
        },
    }
    (args.out_dir / "headline.json").write_text(json.dumps(doc, indent=1))
    log(
        f"wrote {args.out_dir}/headline.json, headline.md" + (", headline.png" if measured else "")
    )
    return 0


def render_markdown(
    *,
    command: str,
    date: str,
    commit: str | None,
    measured: Sequence[dict[str, Any]],
    estimates: Sequence[dict[str, Any]],
    labels: Sequence[str],
    settings: RunSettings,
    repeats: int,
    topology: str,
) -> str:
    """``headline.md``: the command and date, then the workloads, measured and estimate
    tables with what each column means."""
    parts = [
        "# EMBark headline suite",
        "",
        f"`python benchmarks/{command}`" if not command.startswith("python") else f"`{command}`",
        "",
        f"{date}" + (f", commit {commit}" if commit else ""),
        "",
    ]
    if measured:
        shares = [
            f"{w['key']} {w['summary']['torchrec-twrw']['comm_share']:.0%}"
            for w in measured
            if "torchrec-twrw" in w["summary"]
        ]
        parts += [
            "## Measured: emulated 2 hosts x 2 ranks",
            "",
            format_workloads_table(measured),
            "",
            f"{repeats} alternating paired repeats (repeat r runs the strategies rotated by r), "
            f"{settings.warmup} warm-up and {settings.steps} measured steps per run; "
            f"`embark-compressed` allows {','.join(settings.allow) or 'nothing'}; every run's "
            f"dense gradients in {settings.dense_compression} (`dense wire`: format and "
            "exchange, one all-reduce over all ranks or embark's host-aware one); "
            + (
                "every run through its strategy's input pipeline (torchrec's "
                "TrainPipelineSparseDist, embark's IDs a step ahead). "
                if settings.pipeline
                else "no input pipeline (--no-pipeline). "
            )
            + "Step ms: median "
            "over repeats of each run's median step; p10-p90 across the repeats' medians. "
            "`x twrw`, `x fp16`: the ratio to that baseline within each repeat, median over "
            "repeats. Emb. exchange share: median share of a step blocked in embedding "
            "all-to-alls. MB/step: inter-host, summed over ranks. Comm-bound rows: light dense "
            "part, link rate from a pilot so that `torchrec-twrw` would spend ~37.5% of its "
            f"step in embedding exchange; measured in the main runs: {', '.join(shares)}.",
            "",
            format_measured_table(measured, labels),
            "",
            "![headline](headline.png)",
            "",
            FIGURE_CAPTION,
            "",
        ]
    if estimates:
        first = estimates[0]
        parts += [
            f"## Estimate: `{topology}` at scale (cost model, not measured)",
            "",
            f"Batch {first['batch_size']} per rank; the calibrated cost model's step estimate "
            "of the embedding part only (lookups, codecs, exchanges, DP all-reduce; no dense "
            "compute or dense all-reduce). torchrec-twrw: torchrec's planner limited to "
            "table-row-wise; torchrec-fp16: torchrec's plan with fp16 wires; embark: the greedy "
            "plan. The original specs (T180's mixed widths kept).",
            "",
            format_estimate_table(estimates, labels),
            "",
        ]
    return "\n".join(parts)


if __name__ == "__main__":
    sys.exit(main())
