"""Cost-model fidelity: predicted vs measured step time of hand-written plans on the emulated
cluster.

For one model (``demo-small`` by default, dot interaction and small MLPs so that the
embedding exchange is a large share of a step) on 2 emulated hosts x 2 ranks, runs the
``embark`` strategy with each of the plans below through ``embark-bench``'s worker
(:mod:`lightning_embark.harness`), every plan once per round and ``--rounds`` rounds in turn
(so that the load of other jobs on this 2-core machine spreads over all plans), takes
the median step time over all rounds' measured steps, and predicts each plan's step
with the :class:`~lightning_embark.planner.CostModel` under a calibration measured
by ``embark-calibrate`` on the same cluster. Prints plan, predicted ms, measured median
ms and relative error, then the Spearman rank correlation and the median absolute
error (targets: >= 0.8 and <= 30%).

A prediction is the cost model's embedding step (lookups, codecs, exchanges, DP
all-reduce) plus one plan-independent part: the dense forward/backward, the dense
gradient all-reduce and the framework's per-step work. That part is measured once, on a
separate reference run whose plan is not in the table (the median over steps of the
step time minus the engine's forward and backward time, on the rank that waited least),
and is the same for every plan.

    python benchmarks/planner_fidelity.py [--calibration calib.json] [--rounds 2] [--steps 25] \
        [--json out.json]
        [--plot fidelity.png]
    # a saved run, nothing runs:
    python benchmarks/planner_fidelity.py --replot out.json [--plot fidelity.png]

Without ``--calibration`` (or when the file does not exist) ``embark-calibrate`` runs
first, on the same cluster shape and link rate, and writes it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from lightning_embark.calibration import spearman
from lightning_embark.lists import list_option
from lightning_embark.plan import ClusterPlan, ClusterType, Compression, Plan, RowSplit, layouts
from lightning_embark.planner import (
    CostModel,
    GreedyConfig,
    GreedyPlanner,
    from_synthetic,
    load_calibration,
)
from lightning_embark.spec import ModelSpec, load_spec

FP32, FP16, FP8 = Compression.FP32, Compression.FP16, Compression.FP8
RB, UB, DP = ClusterType.RB, ClusterType.UB, ClusterType.DP


def _cluster(
    name: str, kind: ClusterType, comp: Compression = FP32, hier: bool = False
) -> ClusterPlan:
    return ClusterPlan(
        name=name,
        type=kind,
        forward_compression=comp,
        backward_compression=comp,
        hierarchical=hier,
    )


def hand_plans(spec: ModelSpec, hosts: int, local: int) -> dict[str, Plan]:
    """Plans that differ in cluster types, layouts, exchange and compression."""
    world = hosts * local
    names = [t.name for t in spec.tables]
    rows = {t.name: t.num_embeddings for t in spec.tables}
    by_rows = sorted(names, key=lambda n: -rows[n])
    small = [n for n in names if rows[n] <= 1000]
    hot = [t.name for t in spec.tables if t.pooling_factor >= 4]

    def plan(clusters: list[ClusterPlan], tables) -> Plan:
        return Plan(
            world_size=world,
            ranks_per_host=local,
            clusters=tuple(clusters),
            tables=tuple(sorted(tables, key=lambda t: names.index(t.table))),
        )

    def tw(cluster: str, tables: list[str], offset: int = 0):
        return [layouts.table_wise(n, cluster, (i + offset) % world) for i, n in enumerate(tables)]

    def rw(cluster: str, tables: list[str], split=RowSplit.HASH):
        return [layouts.row_wise(n, cluster, range(world), split) for n in tables]

    def twrw(cluster: str, tables: list[str], split=RowSplit.RANGE):
        return [
            layouts.table_row_wise(n, cluster, i % hosts, local, split)
            for i, n in enumerate(tables)
        ]

    rest = [n for n in names if n not in small]
    return {
        "RB table-wise fp32 flat": plan([_cluster("rb", RB)], tw("rb", by_rows)),
        "RB table-wise fp32 hierarchical": plan(
            [_cluster("rb", RB, hier=True)], tw("rb", by_rows)
        ),
        "RB table-wise fp8 flat": plan([_cluster("rb", RB, FP8)], tw("rb", by_rows)),
        "RB row-wise hash fp32 flat": plan([_cluster("rb", RB)], rw("rb", names)),
        "RB table-row-wise range fp32 hier": plan(
            [_cluster("rb", RB, hier=True)], twrw("rb", by_rows)
        ),
        "RB column-wise c=4 fp32 flat": plan(
            [_cluster("rb", RB)], [layouts.column_wise(n, "rb", range(world)) for n in names]
        ),
        "UB row-wise hash fp32 flat": plan([_cluster("ub", UB)], rw("ub", names)),
        "UB row-wise range fp16 hier": plan(
            [_cluster("ub", UB, FP16, hier=True)], rw("ub", names, RowSplit.RANGE)
        ),
        "DP small + RB table-wise fp16 hier": plan(
            [_cluster("dp", DP), _cluster("rb", RB, FP16, hier=True)],
            [layouts.data_parallel(n, "dp", world) for n in small]
            + tw("rb", [n for n in by_rows if n in rest]),
        ),
        "UB hot (hash) + RB table-wise fp32 flat": plan(
            [_cluster("ub", UB), _cluster("rb", RB)],
            rw("ub", hot) + tw("rb", [n for n in by_rows if n not in hot]),
        ),
        "all DP": plan(
            [_cluster("dp", DP)], [layouts.data_parallel(n, "dp", world) for n in names]
        ),
    }


def reference_plan(spec: ModelSpec, hosts: int, local: int) -> Plan:
    """The reference run's plan (not in the table): RB grid k=2 x c=2, fp16, flat."""
    world = hosts * local
    tables = tuple(
        layouts.grid(
            t.name, "rb", [[(i + 0) % world, (i + 1) % world], [(i + 2) % world, (i + 3) % world]]
        )
        for i, t in enumerate(spec.tables)
    )
    return Plan(
        world_size=world, ranks_per_host=local, clusters=(_cluster("rb", RB, FP16),), tables=tables
    )


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def run_plans(plans: dict[str, Plan], args: argparse.Namespace, work: Path) -> dict[str, dict]:
    """Each plan through embark-bench's worker on one emulated cluster, ``--rounds`` times
    in turn (so background load spreads over all plans); per plan the pooled step times
    (the slowest rank's, after warm-up) of every round and the engine's per-step times."""
    from lightning_embark.emulation import QUIET_RANK_ENV, EmulatedHosts, EmulationConfig
    from lightning_embark.harness import (
        BenchConfig,
        load_rank_records,
        rank_job_argv,
        summarize_run,
    )

    pooled: dict[str, dict[str, list[float]]] = {
        name: {"step": [], "dense": [], "engine": [], "inter": []} for name in plans
    }
    cluster_config = EmulationConfig(
        num_hosts=args.hosts, ranks_per_host=args.ranks_per_host, rate_mbit=args.rate_mbit
    )
    with EmulatedHosts(cluster_config) as cluster:
        mode = cluster.mode
        print(f"[fidelity] {cluster.describe()}", file=sys.stderr, flush=True)
        for round_ in range(args.rounds):
            for i, (name, plan) in enumerate(plans.items()):
                path = work / f"plan{i}.json"
                plan.save(path)
                bench = BenchConfig(
                    model=args.model,
                    max_rows=args.max_rows,
                    num_hosts=args.hosts,
                    ranks_per_host=args.ranks_per_host,
                    batch_size=args.batch_size,
                    steps=args.steps,
                    warmup=args.warmup,
                    strategies=("embark",),
                    rate_mbit=args.rate_mbit,
                    interaction=args.interaction,
                    dense_arch=args.dense_arch,
                    over_arch=args.over_arch,
                    plan=str(path),
                )
                print(
                    f"[fidelity] round {round_ + 1}/{args.rounds}, plan {i + 1}/{len(plans)}: "
                    f"{name}",
                    file=sys.stderr,
                    flush=True,
                )
                run_dir = work / f"round{round_}" / f"run{i}"
                code = cluster.run(rank_job_argv(bench, "embark", run_dir), env=QUIET_RANK_ENV)
                if code != 0:
                    raise SystemExit(f"plan {name!r} failed with exit code {code}")
                records = load_rank_records(run_dir)
                summary = summarize_run("embark", records, warmup=args.warmup)
                steps = range(args.warmup, min(len(r["engine_ms"]) for r in records))
                ms = [
                    {
                        k: r["engine_ms"][s].get(k, 0.0)
                        for k in (
                            "embark/step_ms",
                            "embark/embedding_forward_ms",
                            "embark/embedding_backward_ms",
                        )
                    }
                    for s in steps
                    for r in records
                ]
                per_rank = len(records)
                acc = pooled[name]
                acc["step"] += [
                    1e3 * max(r["step_seconds"][s] for r in records)
                    for s in range(args.warmup, min(len(r["step_seconds"]) for r in records))
                ]
                for j in range(0, len(ms), per_rank):
                    chunk = ms[j : j + per_rank]
                    acc["dense"].append(
                        min(
                            m["embark/step_ms"]
                            - m["embark/embedding_forward_ms"]
                            - m["embark/embedding_backward_ms"]
                            for m in chunk
                        )
                    )
                    acc["engine"].append(
                        max(
                            m["embark/embedding_forward_ms"] + m["embark/embedding_backward_ms"]
                            for m in chunk
                        )
                    )
                acc["inter"].append(summary["bytes_per_step"]["inter_host"])
                print(
                    f"[fidelity]   median {summary['step_time_ms']['median']:.1f} ms this round",
                    file=sys.stderr,
                    flush=True,
                )
    return {
        name: {
            "median_ms": statistics.median(acc["step"]),
            "p10_ms": _quantile(acc["step"], 0.1),
            "p90_ms": _quantile(acc["step"], 0.9),
            "engine_ms": statistics.median(acc["engine"]),
            "non_embedding_ms": statistics.median(acc["dense"]),
            "inter_host_bytes": statistics.median(acc["inter"]),
            "steps": len(acc["step"]),
            "mode": mode,
        }
        for name, acc in pooled.items()
    }


def calibration_path(args: argparse.Namespace) -> Path:
    path = Path(args.calibration)
    if path.is_file():
        return path
    from lightning_embark.cli import embark_calibrate

    argv = [
        "--out",
        str(path),
        "--hosts",
        str(args.hosts),
        "--ranks-per-host",
        str(args.ranks_per_host),
        "--rate-mbit",
        str(args.rate_mbit),
        "--raw",
        str(path.with_suffix(".raw.json")),
    ]
    if embark_calibrate.main(argv) != 0:
        raise SystemExit("embark-calibrate failed")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="demo-small")
    parser.add_argument("--max-rows", type=int, default=None)
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--ranks-per-host", type=int, default=2)
    parser.add_argument("--rate-mbit", type=float, default=800.0)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=25, help="measured steps per plan and round")
    parser.add_argument("--rounds", type=int, default=2, help="times every plan runs, in turn")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--interaction", default="dot")
    parser.add_argument("--dense-arch", default="64")
    parser.add_argument("--over-arch", default="128,64,1")
    parser.add_argument(
        "--calibration", default="calib.json", help="calibration JSON (measured first if missing)"
    )
    parser.add_argument(
        "--only",
        nargs="*",
        type=list_option(),
        help="run only these plans (names as printed; a comma list, or several)",
    )
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument(
        "--plot", help="also draw predicted against measured step time into this PNG"
    )
    parser.add_argument(
        "--replot",
        metavar="JSON",
        help="run nothing: print the table (and --plot) of a run saved with --json",
    )
    parser.add_argument(
        "--work-dir", help="keep plans and per-rank records here (default: a temporary folder)"
    )
    args = parser.parse_args(argv)
    if args.replot:
        return replot(args.replot, args.plot)
    spec = load_spec(args.model, max_rows=args.max_rows)
    calib = load_calibration(calibration_path(args))
    print(f"calibration: {calib.source}")
    plans = hand_plans(spec, args.hosts, args.ranks_per_host)
    stats = from_synthetic(spec, batch_size=args.batch_size, num_batches=4, seed=0)
    model = CostModel(
        spec,
        calib,
        num_hosts=args.hosts,
        ranks_per_host=args.ranks_per_host,
        batch_size=args.batch_size,
        stats=stats,
    )
    plans["greedy planner (lossless)"] = GreedyPlanner(GreedyConfig()).plan(model).plan
    if args.only:
        only = {name for part in args.only for name in part}
        plans = {k: v for k, v in plans.items() if k in only}
    with tempfile.TemporaryDirectory(prefix="embark-fidelity-") as tmp:
        work = Path(args.work_dir or tmp)
        work.mkdir(parents=True, exist_ok=True)
        measured = run_plans(
            {"reference": reference_plan(spec, args.hosts, args.ranks_per_host), **plans},
            args,
            work,
        )
    fixed = measured.pop("reference")["non_embedding_ms"]
    rows = []
    for name, plan in plans.items():
        est = model.estimate(plan)
        predicted = est.step_time_ms + fixed
        got = measured[name]["median_ms"]
        rows.append(
            {
                "plan": name,
                "predicted_ms": predicted,
                "embedding_ms": est.step_time_ms,
                "measured_ms": got,
                "p10_ms": measured[name]["p10_ms"],
                "p90_ms": measured[name]["p90_ms"],
                "error": (predicted - got) / got,
                "inter_host_mb": measured[name]["inter_host_bytes"] / 1e6,
                "measured_engine_ms": measured[name]["engine_ms"],
                "predicted_per_rank": [r.to_dict() for r in est.per_rank],
            }
        )
    rho, mae = report(
        rows,
        header=(
            f"{args.model}, {args.hosts} hosts x {args.ranks_per_host} ranks "
            f"({next(iter(measured.values()))['mode']}, {args.rate_mbit:g} Mbit/s), batch "
            f"{args.batch_size}/rank, {args.rounds} rounds of {args.steps} steps after "
            f"{args.warmup} warm-up; plan-independent part {fixed:.1f} ms (reference run)"
        ),
    )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "rows": rows,
                    "spearman": rho,
                    "median_abs_error": mae,
                    "fixed_ms": fixed,
                    "calibration": calib.to_dict(),
                    "args": vars(args),
                },
                indent=2,
            )
        )
    if args.plot:
        plot_fidelity(rows, args.plot, model=args.model)
    return 0


def figures(rows: list[dict]) -> tuple[float, float]:
    """Spearman correlation of predicted and measured, and the median absolute error."""
    rho = spearman([r["predicted_ms"] for r in rows], [r["measured_ms"] for r in rows])
    return rho, statistics.median(abs(r["error"]) for r in rows)


def report(rows: list[dict], *, header: str) -> tuple[float, float]:
    """Print the table and the two figures; returns (Spearman, median absolute error)."""
    rho, mae = figures(rows)
    print(f"\n{header}\n")
    print("| plan | predicted ms | measured median ms (p10-p90) | error |\n|---|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['plan']} | {r['predicted_ms']:.1f} | {r['measured_ms']:.1f} "
            f"({r['p10_ms']:.0f}-{r['p90_ms']:.0f}) | {100 * r['error']:+.0f}% |"
        )
    print(
        f"\nSpearman {rho:.2f} (target >= 0.8), median absolute error {100 * mae:.0f}% (target <= "
        "30%)"
    )
    return rho, mae


def plot_fidelity(rows: list[dict], path: str, *, model: str) -> None:
    """Predicted against measured step time per plan (p10-p90 as error bars), with the
    diagonal and the +-30% band, written as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    fig, ax = plt.subplots(figsize=(11, 7))
    measured = [r["measured_ms"] for r in rows]
    predicted = [r["predicted_ms"] for r in rows]
    spread = [
        [m - r["p10_ms"] for m, r in zip(measured, rows, strict=False)],
        [r["p90_ms"] - m for m, r in zip(measured, rows, strict=False)],
    ]
    ax.errorbar(predicted, measured, yerr=spread, fmt="o", capsize=3)
    for i, r in enumerate(rows, 1):
        ax.annotate(
            str(i),
            (r["predicted_ms"], r["measured_ms"]),
            fontsize=8,
            xytext=(4, 4),
            textcoords="offset points",
        )
    low = 0.8 * min(min(predicted), min(r["p10_ms"] for r in rows))
    top = 1.25 * max(max(predicted), max(r["p90_ms"] for r in rows))
    line = [low, top]
    ax.plot(line, line, "k-", lw=1, label="measured = predicted")
    ax.fill_between(
        line,
        [low / 1.3, top / 1.3],
        [low / 0.7, top / 0.7],
        color="grey",
        alpha=0.15,
        label="error within 30%",
    )
    rho, mae = figures(rows)
    ax.set(
        xscale="log",
        yscale="log",
        xlim=(low, top),
        ylim=(low, top),
        xlabel="predicted step ms",
        ylabel="measured median step ms (p10-p90)",
        title=f"{model}: Spearman {rho:.2f}, median |error| {100 * mae:.0f}%",
    )
    plain = FuncFormatter(lambda value, _pos: f"{value:g}")
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_formatter(plain)
        axis.set_minor_formatter(plain)
    ax.tick_params(which="minor", labelsize=7)
    ax.legend(loc="upper left")
    names = "\n".join(
        f"{i}  {r['plan']}  ({100 * r['error']:+.0f}%)" for i, r in enumerate(rows, 1)
    )
    fig.text(0.66, 0.5, names, fontsize=8, va="center", family="monospace")
    fig.subplots_adjust(right=0.64)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def replot(path: str, plot: str | None) -> int:
    """The table (and, with ``plot``, the figure) of a run saved with ``--json``."""
    saved = json.loads(Path(path).read_text())
    args = saved.get("args", {})
    model = args.get("model", "?")
    report(
        saved["rows"],
        header=f"{model} (from {path}); calibration: "
        f"{saved.get('calibration', {}).get('source', '?')}",
    )
    if plot:
        plot_fidelity(saved["rows"], plot, model=model)
    return 0


if __name__ == "__main__":
    sys.exit(main())
