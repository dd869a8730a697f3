"""``embark-stats``: per-feature hotness and unique ratio at a batch size, as JSON.

``--data FILE`` reads a Criteo DAC file (tab-separated label, I1..I13, C1..C26);
``--model SPEC`` alone measures the synthetic generator for that spec; with both, the
spec sizes the tables the file's categories hash into (so the unique ratio sees the
same collisions as training).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from lightning_embark.errors import EmbarkError
from lightning_embark.planner import DataStats, from_synthetic, measure


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="embark-stats", description=__doc__.splitlines()[0])
    parser.add_argument("--data", help="Criteo DAC file to measure")
    parser.add_argument(
        "--model", help="model spec JSON or preset (synthetic data, or table sizes for --data)"
    )
    parser.add_argument("--batch-size", type=int, required=True, help="per-rank batch size")
    parser.add_argument("--max-rows", type=int, default=None, help="cap every table's rows")
    parser.add_argument(
        "--num-batches", type=int, default=8, help="batches to measure (default 8)"
    )
    parser.add_argument("--seed", type=int, default=0, help="synthetic generator seed")
    parser.add_argument("--out", required=True, help="statistics JSON to write")
    return parser


def compute(args: argparse.Namespace) -> DataStats:
    """The statistics the arguments ask for."""
    from lightning_embark.spec import load_spec

    if not args.data and not args.model:
        raise EmbarkError("give --data FILE, --model SPEC, or both")
    spec = load_spec(args.model, max_rows=args.max_rows) if args.model else None
    if args.data is None:
        assert spec is not None  # --model was given
        return from_synthetic(
            spec, batch_size=args.batch_size, num_batches=args.num_batches, seed=args.seed
        )
    from lightning_embark.data import DEFAULT_NUM_EMBEDDINGS, CriteoDataset

    rows = spec if spec is not None else (args.max_rows or DEFAULT_NUM_EMBEDDINGS)
    data = CriteoDataset(
        args.data, num_embeddings=rows, batch_size=args.batch_size, split="all", on_error="skip"
    )
    return measure(
        data,
        batch_size=args.batch_size,
        num_batches=args.num_batches,
        source=f"criteo file {args.data}",
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        stats = compute(args)
    except EmbarkError as error:
        print(f"embark-stats: error: {error}", file=sys.stderr)
        return 2
    stats.save(args.out)
    print(
        f"{stats.source}: {len(stats.features)} features, batch {stats.batch_size}, "
        f"{stats.num_batches} batches"
    )
    print(f"{'feature':>12} {'hotness':>9} {'unique':>8} {'std':>7}")
    for name, s in stats.features.items():
        print(f"{name:>12} {s.hotness:9.2f} {s.unique_ratio:8.4f} {s.unique_ratio_std:7.4f}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
