"""Planning time of the greedy planner: 500 tables x 64 ranks and 1,000 x 128.

Tables are drawn (seeded) from the mix of the HugeCTR synthetic sets: 1e3..5e7 rows,
width 64/128, hotness 1..80, Zipf IDs; the cluster is ``dgx-h100``. The target is
at most 1 s and 5 s; torchrec's planner took 53 s for 100 x 64 and over 10 minutes
for 500 x 64 on this kind of machine (docs/architecture.md#hardware-figures).

    python benchmarks/planner_speed.py [--repeats 3] [--allow fp32,fp16]
"""

from __future__ import annotations

import argparse
import random
import statistics

from lightning_embark.lists import parse_list
from lightning_embark.plan import Compression
from lightning_embark.planner import CostModel, GreedyConfig, GreedyPlanner, load_calibration
from lightning_embark.spec import IdDistribution, ModelSpec, TableSpec

CASES = ((500, 8, 8, 1.0), (1000, 16, 8, 5.0))


def random_spec(num_tables: int, seed: int = 0) -> ModelSpec:
    rng = random.Random(seed)
    tables = tuple(
        TableSpec(
            name=f"t{i}",
            num_embeddings=rng.choice([1_000, 100_000, 1_000_000, 10_000_000, 50_000_000]),
            embedding_dim=rng.choice([64, 128]),
            pooling_factor=float(rng.choice([1, 5, 20, 80])),
        )
        for i in range(num_tables)
    )
    return ModelSpec(
        name=f"random-{num_tables}",
        tables=tables,
        id_distribution=IdDistribution(kind="zipf", alpha=1.1),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--allow", default="fp32")
    args = parser.parse_args()
    calib = load_calibration("dgx-h100")
    config = GreedyConfig(allow=parse_list(args.allow, Compression, what="--allow"))
    print(
        f"{'tables':>6} {'ranks':>5} {'median s':>9} {'min s':>7} {'max s':>7} {'limit s':>7} "
        f"{'step ms':>8} ok"
    )
    for tables, hosts, local, limit in CASES:
        spec = random_spec(tables)
        times, step = [], 0.0
        for _ in range(args.repeats):
            model = CostModel(spec, calib, num_hosts=hosts, ranks_per_host=local, batch_size=4096)
            result = GreedyPlanner(config).plan(model)
            times.append(result.planning_seconds)
            step = result.estimate.step_time_ms
        median = statistics.median(times)
        print(
            f"{tables:>6} {hosts * local:>5} {median:9.3f} {min(times):7.3f} {max(times):7.3f} "
            f"{limit:7.1f} {step:8.3f} {'yes' if median <= limit else 'NO'}"
        )


if __name__ == "__main__":
    main()
