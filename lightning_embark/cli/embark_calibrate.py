"""``embark-calibrate``: measure the cost model's constants on the cluster at hand.

Launches :mod:`lightning_embark.calibration._fit` as a worker on every host of an
emulated cluster (torchrun per host, gloo), which measures all-to-alls inside and
across hosts and ring all-reduces at several message sizes, the engine's lookup
store and its codecs; then fits latency and bandwidth per link class by least
squares and writes a :class:`~lightning_embark.planner._hardware.Calibration` JSON
that ``embark-plan --topology calib.json`` reads.

    embark-calibrate --hosts 2 --ranks-per-host 2 --rate-mbit 800 --out calib.json

With ``--from-study STORAGE`` it measures nothing: it refits the constants of an
``embark-tune`` study's topology from the study's own measured trials
(:mod:`lightning_embark.calibration._from_study`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
from pathlib import Path

from lightning_embark import calibration as fitting
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
    parser.add_argument("--hosts", type=int, default=2, help="emulated hosts (default: 2)")
    parser.add_argument(
        "--ranks-per-host", type=int, default=2, help="ranks per host (default: 2)"
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


def run(args: argparse.Namespace) -> dict:
    """Launch the workers and return the raw measurements of rank 0."""
    from lightning_embark.emulation import QUIET_RANK_ENV, EmulatedHosts, EmulationConfig

    if args.repeats < 1:
        raise EmbarkError(f"--repeats must be >= 1, got {args.repeats}")
    sizes = fitting.parse_sizes(args.sizes)
    config = EmulationConfig(
        num_hosts=args.hosts, ranks_per_host=args.ranks_per_host, rate_mbit=args.rate_mbit
    )
    with tempfile.TemporaryDirectory(prefix="embark-calibrate-") as tmp:
        raw = Path(tmp) / "raw.json"
        argv = [
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
        ]
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


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.from_study is not None:
        return from_study(args)
    try:
        measured = run(args)
        mode = measured["cluster"]["mode"]
        label = (
            f"{args.rate_mbit:g} Mbit/s inter-host links"
            if mode == "netns" and args.rate_mbit
            else "unshaped inter-host links"
            if mode == "netns"
            else "LOOPBACK FALLBACK (not emulated)"
        )
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
