"""``embark-calibrate``: measure the cost model's constants on the cluster at hand.

Launches :mod:`lightning_embark.calibration._worker` on every host of an
emulated cluster (torchrun per host, gloo), which measures all-to-alls inside and
across hosts and ring all-reduces at several message sizes, the engine's lookup
store and its codecs; then fits latency and bandwidth per link class by least
squares and writes a :class:`~lightning_embark.planner._hardware.Calibration` JSON
that ``embark-plan --topology calib.json`` reads.

    embark-calibrate --hosts 2 --ranks-per-host 2 --rate-mbit 800 --out calib.json

With ``--device cuda`` it measures this machine's GPUs instead: one rank per GPU under one
local torchrun (no emulation), NCCL collectives, the engine's GPU store and the Triton
codecs. A cluster of GPU hosts runs the worker under its own torchrun on every host and
fits the result with ``--from-raw``:

    embark-calibrate --device cuda --ranks-per-host 8 --out h100.json

With ``--from-study STORAGE`` it measures nothing: it refits the constants of an
``embark-tune`` study's topology from the study's own measured trials
(:mod:`lightning_embark.calibration._from_study`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
from pathlib import Path

import lightning_embark.calibration as fitting
from lightning_embark.cli._args import rate_mbit
from lightning_embark.errors import EmbarkError


def build_parser() -> argparse.ArgumentParser:
    from lightning_embark.emulation import DEFAULT_RATE_MBIT

    parser = argparse.ArgumentParser(
        prog="embark-calibrate",
        description=__doc__.splitlines()[0],
        epilog="Writes a Calibration JSON for embark-plan --topology; --raw keeps the "
        "measurements.",
    )
    parser.add_argument("--out", type=Path, required=True, help="calibration JSON to write")
    parser.add_argument(
        "--device",
        choices=fitting.DEVICE_CHOICES,
        default="cpu",
        help="measure CPU ranks over gloo on an emulated cluster, or this machine's GPUs "
        "over NCCL (one rank per GPU, no emulation); auto picks cuda where a GPU is "
        "visible (default: cpu)",
    )
    parser.add_argument(
        "--hosts", type=int, default=None, help="emulated hosts (default: 2; 1 with cuda)"
    )
    parser.add_argument(
        "--ranks-per-host",
        type=int,
        default=None,
        help="ranks per host (default: 2; with cuda, every visible GPU)",
    )
    parser.add_argument(
        "--rate-mbit",
        type=rate_mbit,
        default=DEFAULT_RATE_MBIT,
        help=f"inter-host link rate in Mbit/s, or 'none' (default: {DEFAULT_RATE_MBIT:g})",
    )
    parser.add_argument(
        "--sizes",
        default="4K,64K,256K,1M,4M",
        help="per-peer message sizes, comma-separated, K/M suffixes (default: 4K,64K,256K,1M,4M)",
    )
    parser.add_argument(
        "--repeats", type=int, default=5, help="timed repeats per size; the median counts"
    )
    parser.add_argument(
        "--lookup-rows", type=int, default=100_000, help="rows of the lookup benchmark's table"
    )
    parser.add_argument(
        "--lookup-batch", type=int, default=2048, help="bags of the lookup benchmark"
    )
    parser.add_argument(
        "--dim", type=int, default=128, help="row width of the lookup and codec benchmarks"
    )
    parser.add_argument("--name", default="measured", help="name recorded in the calibration")
    parser.add_argument(
        "--loopback", action="store_true", help="no emulation: every rank on plain loopback"
    )
    parser.add_argument(
        "--raw", type=Path, default=None, help="also write the raw measurements and fits here"
    )
    parser.add_argument(
        "--from-raw",
        type=Path,
        default=None,
        metavar="RAW",
        help="fit measurements taken elsewhere instead of measuring: the worker's JSON (run "
        "under your own torchrun on every GPU host) or a --raw file",
    )
    parser.add_argument(
        "--from-study",
        default=None,
        metavar="STORAGE",
        help="refit the study's topology from an embark-tune study's measured trials instead "
        "of measuring (an Optuna storage URL or journal file)",
    )
    parser.add_argument(
        "--study-name", default="embark-tune", help="the study in --from-study's storage"
    )
    return parser


def from_study(args: argparse.Namespace) -> int:
    """``--from-study``: refit the constants from a study's (plan, estimate, measured) points."""
    from lightning_embark.search import study_points

    try:
        config, points = study_points(args.from_study, args.study_name)
        result = fitting.refit_study(config, points)
    except EmbarkError as error:
        print(f"embark-calibrate: error: {error}", file=sys.stderr)
        return 2
    scaled = [f"{k} x{v:.3g}" for k, v in result.scales.items() if k not in result.kept]
    kept = [f"{k} kept (the study's plans give it no weight)" for k in result.kept]
    print(
        f"refit {config['topology']!r} from {result.points} measured trials of study "
        f"{args.study_name!r}: "
        + ", ".join(scaled + kept)
        + f"; unpriced {result.intercept_ms:.1f} ms per step"
    )
    print(
        f"rank correlation of estimated and measured steps: {result.rho_before:.2f} before, "
        f"{result.rho_after:.2f} after"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result.calibration.save(args.out)
    print(f"wrote {args.out}")
    return 0


def cluster_shape(
    device: str, hosts: int | None, ranks_per_host: int | None, *, gpus: int
) -> tuple[int, int]:
    """The ``(hosts, ranks per host)`` to measure on ``device`` (``cpu`` or ``cuda``).

    The CPU emulates hosts (default 2 x 2). On CUDA the ranks are this machine's GPUs,
    one each, under one local torchrun: one host (its links are NVLink or PCIe, so
    emulated hosts would measure NVLink as the inter-host link), every visible GPU by
    default.

    Raises:
        EmbarkError: on CUDA, more than one host, more ranks than GPUs, or fewer than two
            (no link to fit); each names the fix.
    """
    if device == "cpu":
        return hosts or 2, ranks_per_host or 2
    if hosts not in (None, 1):
        raise EmbarkError(
            f"--device cuda measures this machine's GPUs as one host, got --hosts {hosts}; on "
            "several GPU hosts run the worker under torchrun on each (python -m "
            "lightning_embark.calibration._worker --device cuda --out raw.json) and fit it "
            "with embark-calibrate --from-raw raw.json"
        )
    ranks = ranks_per_host or gpus
    if ranks > gpus:
        raise EmbarkError(
            f"--device cuda runs one rank per GPU: --ranks-per-host {ranks} needs that many, "
            f"this machine has {gpus}"
        )
    if ranks < 2:
        raise EmbarkError(
            f"calibration fits the links between ranks, and --device cuda runs one rank per "
            f"GPU (NCCL refuses two on one): it needs at least 2 GPUs, got {ranks}"
        )
    return 1, ranks


def worker_argv(args: argparse.Namespace, sizes: list[int], raw: Path, device: str) -> list[str]:
    """The worker's command line after ``torchrun [options]``."""
    return [
        str(fitting.worker_script()),
        "--out",
        str(raw),
        "--sizes",
        ",".join(map(str, sizes)),
        "--repeats",
        str(args.repeats),
        "--lookup-rows",
        str(args.lookup_rows),
        "--lookup-batch",
        str(args.lookup_batch),
        "--dim",
        str(args.dim),
        "--device",
        device,
    ]


def run_gpus(args: argparse.Namespace, device: str) -> dict:
    """``--device cuda``: one local torchrun with a rank per GPU; the raw measurements."""
    import torch

    from lightning_embark.emulation import (
        QUIET_RANK_ENV,
        HostLaunch,
        free_loopback_port,
        run_job,
        torchrun_argv,
    )

    if args.repeats < 1:
        raise EmbarkError(f"--repeats must be >= 1, got {args.repeats}")
    sizes = fitting.parse_sizes(args.sizes)
    hosts, per_host = cluster_shape(
        device, args.hosts, args.ranks_per_host, gpus=torch.cuda.device_count()
    )
    description = f"{per_host} GPU(s) of this machine ({torch.cuda.get_device_name(0)}), NCCL"
    with tempfile.TemporaryDirectory(prefix="embark-calibrate-") as tmp:
        raw = Path(tmp) / "raw.json"
        env = dict(os.environ, **QUIET_RANK_ENV)
        env.update(EMBARK_NUM_HOSTS=str(hosts), EMBARK_RANKS_PER_HOST=str(per_host))
        cmd = torchrun_argv(
            python=sys.executable,
            nnodes=1,
            node_rank=0,
            nproc_per_node=per_host,
            master_addr="127.0.0.1",
            master_port=free_loopback_port(),
            argv=worker_argv(args, sizes, raw, device),
        )
        print(f"[embark-calibrate] {description}", file=sys.stderr, flush=True)
        code = run_job([HostLaunch(label="[gpus]", argv=cmd, env=env)])
        if code != 0:
            raise EmbarkError(
                f"calibration workers failed with exit code {code}; see the logs above"
            )
        measured = json.loads(raw.read_text())
    measured["cluster"] = {"mode": "gpus", "description": description, "rate_mbit": None}
    return measured


def run(args: argparse.Namespace) -> dict:
    """Launch the workers and return the raw measurements of rank 0."""
    from lightning_embark.emulation import QUIET_RANK_ENV, EmulatedHosts, EmulationConfig

    device = resolve_cli_device(args.device)
    if device == "cuda":
        return run_gpus(args, device)
    if args.repeats < 1:
        raise EmbarkError(f"--repeats must be >= 1, got {args.repeats}")
    sizes = fitting.parse_sizes(args.sizes)
    hosts, per_host = cluster_shape(device, args.hosts, args.ranks_per_host, gpus=0)
    config = EmulationConfig(num_hosts=hosts, ranks_per_host=per_host, rate_mbit=args.rate_mbit)
    with tempfile.TemporaryDirectory(prefix="embark-calibrate-") as tmp:
        raw = Path(tmp) / "raw.json"
        argv = worker_argv(args, sizes, raw, device)
        with EmulatedHosts(config, force_loopback=args.loopback) as cluster:
            description = cluster.describe()
            print(f"[embark-calibrate] {description}", file=sys.stderr, flush=True)
            code = cluster.run(argv, env=QUIET_RANK_ENV)
            mode = cluster.mode
        if code != 0:
            raise EmbarkError(
                f"calibration workers failed with exit code {code}; see the logs above"
            )
        measured = json.loads(raw.read_text())
    measured["cluster"] = {"mode": mode, "description": description, "rate_mbit": args.rate_mbit}
    return measured


def resolve_cli_device(choice: str) -> str:
    """``--device`` as a device type; ``auto`` and ``cuda`` ask torch whether a GPU is
    visible (the CPU default never does, so CPU runs import no CUDA state)."""
    if choice == "cpu":
        return "cpu"
    import torch

    return fitting.resolve_device(choice, cuda_available=torch.cuda.is_available())


def from_raw(path: Path) -> dict:
    """``--from-raw``: the worker's measurements, or the ``measured`` part of a ``--raw`` file.

    Raises:
        EmbarkError: the file cannot be read or holds no measurements.
    """
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise EmbarkError(f"cannot read --from-raw {str(path)!r}: {error}") from error
    measured = data.get("measured", data) if isinstance(data, dict) else None
    if not isinstance(measured, dict) or "lookups" not in measured or "world" not in measured:
        raise EmbarkError(
            f"--from-raw {str(path)!r} holds no calibration measurements (the worker's --out "
            "JSON or an embark-calibrate --raw file)"
        )
    measured.setdefault("cluster", {"mode": "raw", "description": str(path), "rate_mbit": None})
    return measured


def cluster_label(measured: dict) -> str:
    """What the links were, for the calibration's ``source`` (from the measurement's own
    ``cluster`` record, so that a refit of a ``--raw`` file keeps its original label)."""
    cluster = measured.get("cluster", {})
    mode, rate = cluster.get("mode"), cluster.get("rate_mbit")
    if mode == "netns":
        return f"{rate:g} Mbit/s inter-host links" if rate else "unshaped inter-host links"
    if mode == "gpus":
        return "one machine's GPUs"
    if mode == "raw":
        return f"fitted from {cluster.get('description')}"
    return "LOOPBACK FALLBACK (not emulated)"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.from_study is not None:
        return from_study(args)
    try:
        measured = from_raw(args.from_raw) if args.from_raw is not None else run(args)
        label = cluster_label(measured)
        calib, fits = fitting.build_calibration(
            measured,
            name=args.name,
            label=label,
            memory_per_rank=fitting.machine_memory_per_rank(measured["world"]),
        )
    except EmbarkError as error:
        print(f"embark-calibrate: error: {error}", file=sys.stderr)
        return 2
    links = {k: f for k, f in fits.items() if isinstance(f, fitting.LinkFit)}
    for key, fit in links.items():
        print(
            f"{key:>15}: latency {1e6 * fit.latency:9.1f} us, bandwidth "
            f"{fit.bandwidth / 1e6:9.1f} MB/s (fit rms error {100 * fit.rel_rms:.0f}%)"
        )
    if calib.hierarchical_inter_efficiency != 1.0:
        print(
            f"{'hierarchical':>15}: cross-host stage at "
            f"{calib.hierarchical_inter_efficiency:.2f}x the inter-host fit "
            "(whole two-stage exchanges)"
        )
    for key, what in (("lookup", "row updated"), ("unique_pooling", "unique row")):
        if key in fits:
            f = fits[key]
            print(
                f"{key:>15}: {1e9 * f.bag:.0f} ns/bag + {1e9 * f.id:.0f} ns/ID + "
                f"{1e9 * f.unique_row:.0f} ns/{what} + {f.bandwidth / 1e9:.2f} GB/s, forward and "
                f"backward (fit rms error {100 * f.rel_rms:.0f}%)"
            )
    cast = calib.cast_codec_bandwidth or calib.codec_bandwidth
    int8 = calib.int8_codec_bandwidth or calib.codec_bandwidth
    print(
        f"{'codecs':>15}: fp8 {calib.codec_bandwidth / 1e9:.2f} GB/s, int8 {int8 / 1e9:.2f} GB/s, "
        f"fp16/bf16 {cast / 1e9:.2f} GB/s (fp32 bytes, encode and decode)"
    )
    print(f"source: {calib.source}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    calib.save(args.out)
    print(f"wrote {args.out}")
    if args.raw is not None:
        fitted = {k: dataclasses.asdict(f) for k, f in fits.items()}
        args.raw.write_text(json.dumps({"measured": measured, "fits": fitted}, indent=2))
        print(f"wrote {args.raw}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
