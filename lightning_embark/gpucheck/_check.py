"""The check: the kernels' self-check, the engine against the oracle, what a GPU sees of a
step, step timings.

How the kernels run is the check's to set up, before any of its processes imports triton
(the ranks are spawned, so each imports it afresh): on CUDA compiled, on the CPU in
Triton's interpreter (``TRITON_INTERPRET=1``, set in the ranks' environment; nothing to
set by hand). The report says which (``kernel_mode``).

Tolerances (per element, from the arithmetic; ``u = 2**-24``, ``gamma(n) = n u / (1 - n
u)``, ``W`` ranks, bags of at most ``n`` IDs, rows read at most ``c`` times):

* pooled outputs, fp32 wire: ``2 gamma(n + W) M`` with ``M`` the pooled magnitude
  ``sum |coef w|`` (the engine adds a bag's rows, and row shards' partial sums, in
  another order than the oracle);
* compressed forward wire: that, plus the codec's round trip on what crosses:
  ``rel M + (row max|w| + abs) n`` (:class:`~lightning_embark.wire.ErrorBound`; a UB
  cluster sends table rows, an RB cluster pooled rows, both bounded so);
* updated weights: ``lr (2 gamma(c + W) + rel_b) G + lr abs_b c + 2 u |w'|`` with ``G``
  the gradient's magnitude ``sum |coef g|`` and ``rel_b``, ``abs_b`` the backward codec's
  bound (0 for fp32): the gradient is summed in another order and may cross compressed,
  and the update rounds once.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

from lightning_embark.errors import ConfigError
from lightning_embark.gpucheck._counts import format_counts
from lightning_embark.gpucheck._ranks import RankJob, run_rank
from lightning_embark.gpucheck._scenario import (
    CLUSTERS,
    LEARNING_RATE,
    TABLES,
    Oracle,
    Scenario,
    build,
    oracle,
)
from lightning_embark.wire import codec_for

U = 2.0**-24
#: The sizes a run takes by default, per device. On one GPU most of a first CUDA run is
#: compiling the kernels' specializations, once each: 32 self-check cases and the engine's
#: steps launch about 58 of the pack kernel and 49 of the unpack kernel, 70-105 s of
#: compiling on a 2-core CPU (``benchmarks/gpucheck_compile.py``), so the run fits in 3
#: minutes (``--kernel-cases 200``: about 390, 4-6 minutes). The CPU sizes take about 25 s of
#: CPU (docs/benchmarks.md, "The GPU check's run time").
DEFAULTS: dict[str, dict[str, int]] = {
    "cuda": {"batch": 64, "timing_batch": 4096, "steps": 20, "warmup": 5, "kernel_cases": 32},
    "cpu": {"batch": 64, "timing_batch": 256, "steps": 3, "warmup": 1, "kernel_cases": 24},
}
#: Triton's switch to its interpreter, read once when triton is first imported.
INTERPRET_ENV = "TRITON_INTERPRET"


@dataclass(frozen=True, kw_only=True)
class CheckConfig:
    """What the check runs.

    The sizes left None take the device's :data:`DEFAULTS`.

    Attributes:
        device: ``cuda`` or ``cpu`` (the CPU runs the kernels in Triton's interpreter).
        worlds: Rank counts of the engine check (a CUDA world needs a GPU per rank).
        batch: Samples per rank of the exact and the counted step.
        timing_batch: Samples per rank of the timed steps.
        steps: Timed steps per cluster type and kernel backend.
        warmup: Untimed steps before them.
        kernel_cases: Randomised cases of the kernels' self-check (four ops each).
        store: The engine's store: ``torch`` or ``fbgemm``.
        seed: Seed of the scenario and the self-check.
    """

    device: str = "cuda"
    worlds: tuple[int, ...] = (1, 2)
    batch: int | None = None
    timing_batch: int | None = None
    steps: int | None = None
    warmup: int | None = None
    kernel_cases: int | None = None
    store: str = "torch"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.device not in ("cuda", "cpu"):
            raise ConfigError(f"--device must be cuda or cpu, got {self.device!r}")
        for name, value in DEFAULTS[self.device].items():
            if getattr(self, name) is None:
                object.__setattr__(self, name, value)
        if self.store == "fbgemm" and self.device == "cuda":
            raise ConfigError(
                "--store fbgemm drives fbgemm's CPU kernels only; on a GPU use --store torch"
            )
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ConfigError("--device cuda, but torch sees no GPU; use --device cpu")
        if not self.worlds or any(w < 1 for w in self.worlds):
            raise ConfigError(f"--worlds must be positive rank counts, got {self.worlds}")
        for name in ("batch", "timing_batch", "steps", "kernel_cases"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be >= 1")
        if _size(self.warmup) < 0:
            raise ConfigError(f"--warmup must be >= 0, got {self.warmup}")
        if self.store not in ("torch", "fbgemm"):
            raise ConfigError(f"--store must be torch or fbgemm, got {self.store!r}")

    def runnable_worlds(self) -> tuple[list[int], list[str]]:
        """The worlds this machine can run, and why any other is skipped."""
        if self.device == "cpu":
            return list(self.worlds), []
        gpus = torch.cuda.device_count()
        ok = [w for w in self.worlds if w <= gpus]
        skipped = [f"world {w}: needs {w} GPUs, {gpus} visible" for w in self.worlds if w > gpus]
        return ok, skipped


def environment(device: str) -> dict[str, Any]:
    """What ran the check: versions, the device, and whether torchrec/fbgemm import."""
    import triton

    info: dict[str, Any] = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
    }
    for package in ("torchrec", "fbgemm_gpu"):
        try:
            __import__(package)
            info[package] = "importable"
        except Exception as error:  # absent or not loadable here: the point of the check
            info[package] = f"not importable ({type(error).__name__})"
    return info


def compare(scenario: Scenario, truth: Oracle, ranks: Sequence[dict[str, Any]]) -> list[dict]:
    """Per table: the largest error of the outputs and of the updated weights, each over
    its bound (at most 1 passes; see the module docstring)."""
    world = len(ranks)
    out = torch.cat([r["exact"]["out"] for r in ranks]).to(torch.float64)
    tables = _assemble(scenario, ranks)
    rows, column = [], 0
    for t in scenario.tables:
        name = t.name.removeprefix("t_")
        cluster = TABLES[name][3]
        forward, backward = (
            (CLUSTERS[cluster][1], CLUSTERS[cluster][2]) if cluster in CLUSTERS else ("fp32",) * 2
        )
        cols = slice(column, column + t.embedding_dim)
        magnitude = truth.pooled_magnitude[:, cols]
        bound = 2 * _gamma(truth.max_bag + world) * magnitude
        fb = codec_for(forward, backward=False).bound
        wmax = float(scenario.weights[t.name].abs().max())
        bound = bound + fb.rel * magnitude + (fb.row * wmax + fb.abs) * truth.max_bag
        out_ratio = _ratio(out[:, cols] - truth.pooled[:, cols], bound)
        bb = codec_for(backward, backward=True).bound
        grad = truth.grad_magnitude[t.name]
        expected = truth.tables[t.name]
        wbound = (
            LEARNING_RATE * (2 * _gamma(truth.max_count + world) + bb.rel) * grad
            + LEARNING_RATE * bb.abs * truth.max_count
            + 2 * U * expected.abs()
        )
        weight_ratio = _ratio(tables[t.name] - expected, wbound)
        rows.append(
            {
                "table": name,
                "cluster": cluster,
                "wire": f"{forward}/{backward}" if cluster != "dp" else "-",
                "output_error_over_bound": out_ratio,
                "weight_error_over_bound": weight_ratio,
                "ok": out_ratio <= 1.0 and weight_ratio <= 1.0,
            }
        )
        column += t.embedding_dim
    return rows


def _gamma(n: int) -> float:
    return n * U / (1 - n * U)


def _ratio(error: torch.Tensor, bound: torch.Tensor) -> float:
    """The worst ``|error| / bound``; an error where the bound is 0 counts as infinite."""
    error = error.abs()
    if not error.numel():
        return 0.0
    safe = torch.where(bound > 0, bound, torch.ones_like(bound))
    ratio = torch.where(bound > 0, error / safe, torch.where(error > 0, torch.inf, 0.0))
    return float(ratio.max())


def _assemble(scenario: Scenario, ranks: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """Every table from the ranks' blocks (replicas must agree: checked by overwrite and
    compare)."""
    full = {
        t.name: torch.full((t.num_embeddings, t.embedding_dim), torch.nan, dtype=torch.float64)
        for t in scenario.tables
    }
    for result in ranks:
        for name, rows, start, end, weight in result["exact"]["shards"]:
            target = full[name][rows, start:end]
            new = weight.to(torch.float64)
            known = ~torch.isnan(target)
            if bool((target[known] != new[known]).any()):
                raise AssertionError(f"replicas of table {name!r} disagree after the step")
            full[name][rows, start:end] = new
    for name, table in full.items():
        if bool(torch.isnan(table).any()):
            raise AssertionError(f"no rank holds some rows of table {name!r}")
    return full


def run_world(
    config: CheckConfig, world: int, folder: Path, *, kernel_cases: int = 0
) -> list[dict[str, Any]]:
    """Spawn ``world`` ranks and return their results in rank order (rank 0 runs
    ``kernel_cases`` cases of the kernels' self-check first)."""
    job = RankJob(
        device=config.device,
        rendezvous=str(folder / "rendezvous"),
        out=str(folder),
        batch=_size(config.batch),
        timing_batch=_size(config.timing_batch),
        steps=_size(config.steps),
        warmup=_size(config.warmup),
        store=config.store,
        seed=config.seed,
        kernel_cases=kernel_cases,
    )
    with kernel_environment(config.device):
        mp.start_processes(run_rank, args=(world, job), nprocs=world, start_method="spawn")
    return [torch.load(folder / f"rank{r}.pt", weights_only=False) for r in range(world)]


def _size(value: int | None) -> int:
    assert value is not None, "CheckConfig fills every size in"
    return value


@contextlib.contextmanager
def kernel_environment(device: str) -> Iterator[None]:
    """The environment the ranks start in: Triton's interpreter for CPU ranks, compiled
    kernels for CUDA ones (a ``TRITON_INTERPRET`` of the caller's is set aside)."""
    saved = os.environ.get(INTERPRET_ENV)
    if device == "cpu":
        os.environ[INTERPRET_ENV] = "1"
    else:
        os.environ.pop(INTERPRET_ENV, None)
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(INTERPRET_ENV, None)
        else:
            os.environ[INTERPRET_ENV] = saved


def run_check(config: CheckConfig) -> dict[str, Any]:
    """The whole check, as the JSON document it writes (``ok`` says whether it passed)."""
    start = time.perf_counter()
    report: dict[str, Any] = {"config": vars(config) | {"worlds": list(config.worlds)}}
    report["environment"] = environment(config.device)
    worlds, skipped = config.runnable_worlds()
    report["skipped"] = skipped
    report["engine"], report["timings"], report["overlap"], report["counts"] = [], [], [], []
    cases: list[dict[str, Any]] = []
    for index, world in enumerate(worlds):
        scenario = build(world, batch=_size(config.batch), seed=config.seed)
        truth = oracle(scenario)
        with tempfile.TemporaryDirectory(prefix="embark-gpucheck-") as tmp:
            ranks = run_world(
                config, world, Path(tmp), kernel_cases=0 if index else _size(config.kernel_cases)
            )
        if index == 0:  # the first world's rank 0 ran the kernels' self-check
            cases = ranks[0]["kernels"]["cases"]
            report["environment"]["kernel_mode"] = _kernel_mode(
                config.device, ranks[0]["kernels"]["interpreted"]
            )
        report["engine"] += [{"world": world} | row for row in compare(scenario, truth, ranks)]
        report["timings"] += [{"world": world} | row for row in _speedups(ranks[0]["timings"])]
        report["overlap"].append(
            {"world": world, "bit_identical": all(r["exact"]["overlap_identical"] for r in ranks)}
        )
        report["counts"] += [{"world": world, "rank": r["rank"]} | r["counted"] for r in ranks]
    report["kernels"] = {
        "cases": len(cases),
        "bit_identical": sum(c["ok"] for c in cases),
        "failures": [c for c in cases if not c["ok"]][:20],
    }
    report["ok"] = (
        bool(cases)
        and not report["kernels"]["failures"]
        and bool(report["engine"])
        and all(row["ok"] for row in report["engine"])
        and all(row["bit_identical"] for row in report["overlap"])
    )
    report["seconds"] = time.perf_counter() - start
    return report


def _kernel_mode(device: str, interpreted: bool) -> str:
    """How the self-check's kernels ran, in words."""
    if interpreted:
        return f"Triton interpreter ({INTERPRET_ENV}=1, set by the check for its {device} ranks)"
    return f"compiled Triton kernels on {device}"


def _speedups(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each cluster's fused (Triton) and unfused (torch ops) step, and their ratio."""
    out = []
    for cluster in dict.fromkeys(r["cluster"] for r in rows):
        by = {r["backend"]: r for r in rows if r["cluster"] == cluster}
        fused, unfused = by["triton"]["median_ms"], by["reference"]["median_ms"]
        out.append(
            {
                "cluster": cluster,
                "fused_ms": fused,
                "unfused_ms": unfused,
                "unfused_over_fused": unfused / fused if fused > 0 else None,
                "steps": by["triton"]["steps"],
            }
        )
    return out


def write_report(report: dict[str, Any], path: str | Path) -> None:
    """The report as JSON at ``path``."""
    Path(path).write_text(json.dumps(report, indent=2, default=str) + "\n")


def format_report(report: dict[str, Any]) -> str:
    """The report as the tables the command prints."""
    env = report["environment"]
    kernels = report["kernels"]
    lines = [
        f"device: {env['device']}  torch {env['torch']}  triton {env['triton']}  "
        f"torchrec: {env['torchrec']}  fbgemm_gpu: {env['fbgemm_gpu']}",
        f"kernels: {kernels['bit_identical']} of {kernels['cases']} ops bit-identical to the "
        f"reference ({env.get('kernel_mode', 'not run: no world ran')})",
        "",
        "| world | table | cluster | wire fwd/bwd | output err/bound | weight err/bound | ok |",
        "|---:|---|---|---|---:|---:|---|",
    ]
    for row in report["engine"]:
        lines.append(
            f"| {row['world']} | {row['table']} | {row['cluster']} | {row['wire']} | "
            f"{row['output_error_over_bound']:.3g} | {row['weight_error_over_bound']:.3g} | "
            f"{'yes' if row['ok'] else 'NO'} |"
        )
    lines += [
        "",
        "| world | cluster | fused ms | unfused ms | unfused / fused |",
        "|---:|---|---:|---:|---:|",
    ]
    for row in report["timings"]:
        ratio = row["unfused_over_fused"]
        lines.append(
            f"| {row['world']} | {row['cluster']} | {row['fused_ms']:.2f} | "
            f"{row['unfused_ms']:.2f} | {'-' if ratio is None else f'{ratio:.2f}'} |"
        )
    lines += [
        f"world {row['world']}: the step with overlapped exchanges is "
        f"{'bit-identical' if row['bit_identical'] else 'NOT bit-identical'} to the plain one"
        for row in report["overlap"]
    ]
    if report["counts"]:
        lines += format_counts(report["counts"])
    lines += [f"skipped: {s}" for s in report["skipped"]]
    lines.append(f"{'PASSED' if report['ok'] else 'FAILED'} in {report['seconds']:.0f} s")
    return "\n".join(lines)
