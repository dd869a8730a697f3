"""Estimated step time of the greedy plan vs torchrec's plan, under one cost model.

For MLPerf DLRM-DCNv2, T180, T200 and T510 on ``dgx-h100`` (datasheet calibration)
with 8 and 16 hosts of 8 ranks, batch 4096 per rank, lossless compression only:
plans with our greedy planner and with torchrec's ``EmbeddingShardingPlanner``,
imports torchrec's plan and estimates both with the same :class:`CostModel`.
torchrec's proposers take minutes to hours beyond ~30 tables x 64 ranks
(docs/architecture.md#hardware-figures; ``GreedyProposer`` alone had not finished T180 on 8 x 8
after 22 minutes),
so its search runs under torchrec's own ``timeout_seconds`` (default 600 s): past it,
torchrec returns the best plan its proposers found so far. The table says which
proposers ran, how many proposals they rated and whether the search was cut.

The towers column is our plan with DMT towers under the same model: the statistics-only
partitioner's ``--towers-per-host`` towers per host with ``projection`` tower modules of
``--tower-ratio`` (default 4), fp32 tower outputs (lossless wire, a lossy model change).
``--no-torchrec`` leaves torchrec's planner out (its search is the slow part).

    python benchmarks/planner_quality.py [--models ...] [--hosts 8 16] \
        [--proposer default|greedy] [--torchrec-timeout 600] \
        [--towers-per-host 1] [--tower-ratio 4] [--no-torchrec]
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics

from lightning_embark.baseline import plan_from_torchrec, torchrec_plan
from lightning_embark.lists import list_option
from lightning_embark.plan import TowerModule
from lightning_embark.planner import (
    CostModel,
    GreedyPlanner,
    load_calibration,
    plan_with_towers,
    resolve_towers,
)
from lightning_embark.spec import load_spec

MODELS = (
    "mlperf-dlrm-dcnv2",
    "hugectr-180table-70B-hotness80",
    "hugectr-200table-100B-hotness20",
    "hugectr-510table-110B-hotness5",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--models", nargs="+", type=list_option(), default=[MODELS], help="comma list (or several)"
    )
    parser.add_argument(
        "--hosts", nargs="+", type=list_option(int), default=[(8, 16)], help="comma list of hosts"
    )
    parser.add_argument("--ranks-per-host", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=4096)
    parser.add_argument("--topology", default="dgx-h100")
    parser.add_argument("--proposer", choices=["default", "greedy"], default="default")
    parser.add_argument(
        "--torchrec-timeout",
        type=int,
        default=600,
        metavar="SECONDS",
        help="torchrec's search budget per plan (0: no limit)",
    )
    parser.add_argument("--towers-per-host", type=int, default=1)
    parser.add_argument("--tower-ratio", type=float, default=4.0)
    parser.add_argument("--no-torchrec", action="store_true", help="towers and greedy only")
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()
    args.models = [m for part in args.models for m in part]
    args.hosts = [h for part in args.hosts for h in part]
    logging.getLogger("torchrec").setLevel(logging.ERROR)
    logging.getLogger().setLevel(logging.ERROR)  # torchrec warns on the root logger per DP table
    calib = load_calibration(args.topology)
    rows = []
    header = (
        f"{'model':<32} {'cluster':>7} {'ours ms':>9} {'towers ms':>9} {'x ours':>6} "
        f"{'torchrec ms':>11} {'ratio':>6} {'ours s':>7} {'torchrec s':>10} {'proposals':>9} "
        "proposers"
    )
    print(f"calibration {calib.name}: {calib.source}")
    print(header)
    for name in args.models:
        spec = load_spec(name)
        for hosts in args.hosts:
            model = CostModel(
                spec,
                calib,
                num_hosts=hosts,
                ranks_per_host=args.ranks_per_host,
                batch_size=args.batch_size,
            )
            ours = GreedyPlanner().plan(model)
            requests = resolve_towers(
                model,
                hosts * args.towers_per_host,
                module=TowerModule.PROJECTION,
                output_ratio=args.tower_ratio,
            )
            towers = plan_with_towers(model, requests).estimate.step_time_ms
            towers_ratio = towers / ours.estimate.step_time_ms
            topology = calib.topology(num_hosts=hosts, ranks_per_host=args.ranks_per_host)
            if args.no_torchrec:
                rows.append(
                    dict(
                        model=name,
                        hosts=hosts,
                        ranks_per_host=args.ranks_per_host,
                        ours_ms=ours.estimate.step_time_ms,
                        towers_ms=towers,
                    )
                )
                print(
                    f"{name:<32} {hosts:>3}x{args.ranks_per_host:<3} "
                    f"{ours.estimate.step_time_ms:9.3f} {towers:9.3f} {towers_ratio:6.3f}",
                    flush=True,
                )
                continue
            planning = torchrec_plan(
                spec,
                num_hosts=hosts,
                ranks_per_host=args.ranks_per_host,
                batch_size=args.batch_size,
                topology=topology,
                proposer=args.proposer,
                timeout_seconds=args.torchrec_timeout or None,
            )
            proposer = args.proposer + (
                f", cut at {args.torchrec_timeout} s" if planning.timed_out else ""
            )
            seconds = planning.seconds
            theirs = plan_from_torchrec(
                planning.plan,
                spec,
                world_size=topology.world_size,
                ranks_per_host=args.ranks_per_host,
            )
            estimate = model.estimate(theirs)
            ratio = ours.estimate.step_time_ms / estimate.step_time_ms
            row = dict(
                model=name,
                hosts=hosts,
                ranks_per_host=args.ranks_per_host,
                ours_ms=ours.estimate.step_time_ms,
                towers_ms=towers,
                torchrec_ms=estimate.step_time_ms,
                ratio=ratio,
                ours_s=ours.planning_seconds,
                torchrec_s=seconds,
                proposer=args.proposer,
                num_proposals=planning.num_proposals,
                timed_out=planning.timed_out,
            )
            rows.append(row)
            print(
                f"{name:<32} {hosts:>3}x{args.ranks_per_host:<3} {row['ours_ms']:9.3f} "
                f"{towers:9.3f} {towers_ratio:6.3f} {row['torchrec_ms']:11.3f} {ratio:6.3f} "
                f"{row['ours_s']:7.2f} {seconds:10.1f} "
                f"{planning.num_proposals:9d} {proposer}",
                flush=True,
            )
    mean = statistics.mean(r["ratio"] for r in rows) if not args.no_torchrec else None
    towers_mean = statistics.mean(r["towers_ms"] / r["ours_ms"] for r in rows)
    print(f"mean towers / ours estimated step time: {towers_mean:.3f}")
    if mean is not None:
        print(f"mean ratio (ours / torchrec estimated step time): {mean:.3f}  (target <= 0.67)")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(
                {
                    "rows": rows,
                    "mean_ratio": mean,
                    "mean_towers_ratio": towers_mean,
                    "calibration": calib.to_dict(),
                },
                handle,
                indent=2,
            )


if __name__ == "__main__":
    main()
