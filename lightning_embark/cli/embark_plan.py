"""``embark-plan``: plan a model for a cluster, print and save it, compare with torchrec.

Output JSON: the Plan's fields plus ``estimate`` ({"step_time_ms", "per_rank", ...}),
``planning_seconds``, ``notes``, ``sparse_optimizer`` (whose state the memory counts,
``--sparse-optimizer``), ``calibration`` and, with ``--compare torchrec``, ``compare.torchrec``
holding torchrec's plan (in our format), its estimate under the same cost model and
its planning time; with ``--towers``, the plan has DMT towers and ``--compare flat``
adds ``compare.flat``, the flat greedy plan and its estimate; with ``--towers auto`` the
plan's ``tower_choice`` holds every candidate priced and why the chosen one won.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from lightning_embark._logs import quiet_torchrec_planner
from lightning_embark.errors import ConfigError, EmbarkError, PlanInfeasibleError
from lightning_embark.lists import list_items
from lightning_embark.plan import Compression, Plan, TowerModule, save_towers, tower_line
from lightning_embark.planner import (
    DEFAULT_SPARSE_OPTIMIZER,
    SPARSE_OPTIMIZER_KINDS,
    CostModel,
    DataStats,
    Estimate,
    GreedyConfig,
    GreedyPlanner,
    PlanResult,
    choose_towers,
    explain_state,
    load_calibration,
    offered_settings,
    plan_with_towers,
    resolve_towers,
    with_sparse_optimizer,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="embark-plan", description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="model spec JSON or preset")
    parser.add_argument(
        "--stats", help="statistics JSON from embark-stats (default: analytic from the spec)"
    )
    parser.add_argument(
        "--topology", default="emulated", help="calibration preset or calibration JSON"
    )
    parser.add_argument("--hosts", type=int, default=1, help="number of hosts")
    parser.add_argument(
        "--ranks-per-host", type=int, default=None, help="ranks per host (default: calibration's)"
    )
    parser.add_argument("--batch-size", type=int, required=True, help="per-rank batch size")
    parser.add_argument(
        "--allow",
        default="fp32",
        help="compressions allowed, e.g. fp16,bf16,fp8,int8 (fp32 always)",
    )
    parser.add_argument(
        "--sparse-optimizer",
        choices=SPARSE_OPTIMIZER_KINDS,
        default=DEFAULT_SPARSE_OPTIMIZER,
        help="the embedding optimizer training will use, whose state the memory counts: "
        "rowwise_adagrad 4 bytes per row, adagrad 4 per element (doubling a row), sgd none "
        f"(default: {DEFAULT_SPARSE_OPTIMIZER})",
    )
    parser.add_argument(
        "--compare",
        default="",
        help="comma list: torchrec (also plan with torchrec and estimate its plan), flat (the "
        "flat greedy plan beside a --towers plan)",
    )
    parser.add_argument(
        "--towers",
        default=None,
        help="plan DMT towers: a count, auto (the cost model's choice of flat or towers: "
        "H, 2H or LH of them, identity or the compressing settings shown to keep accuracy, "
        "the comparison printed) or a towers.json (default: flat)",
    )
    parser.add_argument(
        "--tower-module",
        choices=[m.value for m in TowerModule if m is not TowerModule.CUSTOM],
        default=None,
        help="module of partitioned towers (default identity: the model unchanged); with "
        "--towers auto, the one module the choice may use (the user's explicit choice)",
    )
    parser.add_argument(
        "--tower-ratio",
        type=float,
        default=None,
        help="D_t / O_t of a compressing tower module: its input width over its output width",
    )
    parser.add_argument(
        "--tower-compression",
        choices=[c.value for c in Compression],
        default="fp32",
        help="wire format of the tower outputs crossing hosts and of their gradients",
    )
    parser.add_argument(
        "--towers-out",
        default=None,
        help="write the towers as towers.json (for DLRMConfig(towers=...) or the strategy)",
    )
    parser.add_argument(
        "--torchrec-proposer",
        choices=["default", "greedy"],
        default="default",
        help="torchrec proposers for --compare (greedy: GreedyProposer alone, for large specs)",
    )
    parser.add_argument(
        "--torchrec-timeout",
        type=int,
        default=None,
        metavar="SECONDS",
        help="torchrec's own search budget for --compare: past it torchrec returns the best plan "
        "found so far (default: no limit)",
    )
    parser.add_argument("--plot", help="PNG of per-rank cost, memory and placement")
    parser.add_argument("--max-rows", type=int, default=None, help="cap every table's rows")
    parser.add_argument(
        "--plan",
        default=None,
        help="estimate this plan file (e.g. embark-tune's best plan) instead of planning",
    )
    parser.add_argument("--out", required=True, help="plan JSON to write")
    return parser


def _allow(text: str) -> tuple[Compression, ...]:
    names = list_items(text)
    try:
        return tuple({Compression.FP32, *(Compression(n) for n in names)})
    except ValueError:
        raise EmbarkError(
            f"--allow {text!r}: use a comma list of {[c.value for c in Compression]}"
        ) from None


def _compare(text: str) -> tuple[str, ...]:
    names = tuple(list_items(text))
    unknown = [n for n in names if n not in ("torchrec", "flat")]
    if unknown:
        raise ConfigError(f"--compare {text!r}: unknown {unknown}; use torchrec and/or flat")
    return names


def _towers_option(args: argparse.Namespace) -> str | None:
    """``--towers`` as ``resolve_towers`` takes it; the tower module options checked."""
    if args.towers is None:
        if args.tower_module or args.tower_ratio is not None or args.towers_out:
            raise ConfigError(
                "--tower-module, --tower-ratio and --towers-out need --towers auto|N|FILE"
            )
        return None
    module = TowerModule(args.tower_module or "identity")
    if module is not TowerModule.IDENTITY and args.tower_ratio is None:
        raise ConfigError(f"--tower-module {module.value} needs --tower-ratio R (e.g. 4)")
    if module is TowerModule.IDENTITY and args.tower_ratio is not None:
        raise ConfigError(
            "--tower-ratio needs a compressing --tower-module (projection, dcn, dot)"
        )
    return str(args.towers)


def describe(plan: Plan, estimate: Estimate, label: str) -> str:
    """Per-table layout, per-rank load and the step time, as printed."""
    lines = [f"== {label}: estimated step {estimate.step_time_ms:.3f} ms =="]
    lines += [tower_line(tower) for tower in plan.towers]
    for c in plan.clusters:
        lines.append(
            f"cluster {c.name}: {c.type.value} fwd={c.forward_compression.value} "
            f"bwd={c.backward_compression.value} hierarchical={c.hierarchical}"
        )
    lines.append(f"{'table':>16} {'cluster':>8} {'r':>4} {'k':>4} {'c':>3}  ranks")
    for t in plan.tables:
        ranks = "all" if t.num_replicas == plan.world_size else ",".join(map(str, t.ranks[0]))
        lines.append(
            f"{t.table:>16} {t.cluster:>8} {t.num_replicas:>4} {t.num_row_shards:>4} "
            f"{t.num_col_shards:>3}  {ranks[:60]}"
        )
    lines.append(
        f"{'rank':>5} {'compute':>9} {'intra':>9} {'inter':>9} {'latency':>8} {'allred':>8} "
        f"{'total ms':>9} {'mem GiB':>8}"
    )
    for r in estimate.per_rank:
        lines.append(
            f"{r.rank:>5} {r.compute_ms:9.3f} {r.intra_ms:9.3f} {r.inter_ms:9.3f} "
            f"{r.latency_ms:8.3f} "
            f"{r.allreduce_ms:8.3f} {r.total_ms:9.3f} {r.memory_bytes / 2**30:8.2f}"
        )
    return "\n".join(lines)


def _given(path: str, model: CostModel) -> PlanResult:
    """A plan file, checked against the model and cluster, with its estimate.

    Raises:
        ConfigError: the plan is for another cluster shape or model, or does not fit.
    """
    plan = Plan.load(path)
    calib = model.calib
    try:
        plan.validate(
            model.spec,
            calib.topology(num_hosts=model.num_hosts, ranks_per_host=model.ranks_per_host),
            bytes_per_row_element=calib.bytes_per_element,
        )
    except PlanInfeasibleError as error:
        raise PlanInfeasibleError(
            f"--plan {path}: {error}", table=error.table, shortfall_bytes=error.shortfall_bytes
        ) from error
    except ConfigError as error:
        raise ConfigError(f"--plan {path}: {error}") from error
    return PlanResult(plan=plan, estimate=model.estimate(plan), planning_seconds=0.0)


def run(args: argparse.Namespace) -> dict:
    """Plan (and compare); returns the JSON document."""
    from lightning_embark.spec import load_spec

    spec = load_spec(args.model, max_rows=args.max_rows)
    calib = with_sparse_optimizer(load_calibration(args.topology), args.sparse_optimizer)
    per_host = args.ranks_per_host or calib.ranks_per_host
    stats = DataStats.load(args.stats) if args.stats else None
    model = CostModel(
        spec,
        calib,
        num_hosts=args.hosts,
        ranks_per_host=per_host,
        batch_size=args.batch_size,
        stats=stats,
    )
    compare = _compare(args.compare)
    towers = _towers_option(args)
    if "flat" in compare and towers is None:
        raise ConfigError(
            "--compare flat compares a --towers plan with the flat one; add --towers"
        )
    if args.plan and towers is not None:
        raise ConfigError("--plan estimates a given plan; drop --towers (the plan has its own)")
    planner = GreedyPlanner(GreedyConfig(allow=_allow(args.allow)))
    try:
        if args.plan:
            result = _given(args.plan, model)
        elif towers is None:
            result = planner.plan(model)
        else:
            compression = Compression(args.tower_compression)
            module = TowerModule(args.tower_module) if args.tower_module else None
            if towers == "auto":
                decision = choose_towers(
                    model,
                    planner,
                    settings=offered_settings(module, args.tower_ratio),
                    compression=compression,
                )
                requests, result = decision.towers or [], decision.result
            else:
                requests = resolve_towers(
                    model,
                    towers,
                    module=module,
                    output_ratio=args.tower_ratio,
                    compression=compression,
                )
                result = plan_with_towers(model, requests, planner)
            if args.towers_out:
                save_towers(requests, args.towers_out)
    except PlanInfeasibleError as error:
        raise explain_state(error, args.sparse_optimizer, how="--sparse-optimizer") from error
    print(spec.describe())
    print(f"statistics: {model.stats_source}")
    label = f"plan {args.plan}" if args.plan else f"embark plan ({result.planning_seconds:.3f} s)"
    print(describe(result.plan, result.estimate, label))
    if result.plan.tower_choice is not None:
        print(result.plan.tower_choice.table())
    doc = result.plan.to_dict() | {
        "estimate": result.estimate.to_dict(),
        "planning_seconds": result.planning_seconds,
        "notes": list(result.notes),
        "sparse_optimizer": args.sparse_optimizer,
        "calibration": calib.to_dict(),
    }
    plots = [("embark", result.plan, result.estimate)]
    if args.towers_out:
        kept = "" if result.plan.towers else " (no towers: the model stays flat)"
        print(f"wrote {args.towers_out}{kept}")
    if "flat" in compare:
        flat = planner.plan(model)
        print(describe(flat.plan, flat.estimate, "flat embark plan"))
        print(
            "towers / flat estimated step time: "
            f"{result.estimate.step_time_ms / flat.estimate.step_time_ms:.3f}"
        )
        doc["compare"] = {
            "flat": {"plan": flat.plan.to_dict(), "estimate": flat.estimate.to_dict()}
        }
        plots.append(("flat", flat.plan, flat.estimate))
    if "torchrec" in compare:
        from lightning_embark.baseline import plan_from_torchrec, torchrec_plan

        topology = calib.topology(num_hosts=args.hosts, ranks_per_host=per_host)
        from lightning_embark.calibration import calibration_device

        # What the calibration was measured on (a CPU calibration from embark-calibrate
        # is named "measured"); hand-written files without a record: by preset name.
        device = calibration_device(calib) or ("cpu" if calib.name == "emulated" else "cuda")
        planning = torchrec_plan(
            spec,
            num_hosts=args.hosts,
            ranks_per_host=per_host,
            batch_size=args.batch_size,
            topology=topology,
            proposer=args.torchrec_proposer,
            compute_device=device,
            timeout_seconds=args.torchrec_timeout,
        )
        seconds = planning.seconds
        theirs = plan_from_torchrec(
            planning.plan, spec, world_size=topology.world_size, ranks_per_host=per_host
        )
        estimate = model.estimate(theirs)
        cut = ", search stopped at --torchrec-timeout" if planning.timed_out else ""
        print(
            describe(
                theirs,
                estimate,
                f"torchrec plan ({seconds:.1f} s, {args.torchrec_proposer} proposers{cut})",
            )
        )
        print(
            "embark / torchrec estimated step time: "
            f"{result.estimate.step_time_ms / estimate.step_time_ms:.3f}"
        )
        doc.setdefault("compare", {})["torchrec"] = {
            "plan": theirs.to_dict(),
            "estimate": estimate.to_dict(),
            "planning_seconds": seconds,
            "proposer": args.torchrec_proposer,
            "num_proposals": planning.num_proposals,
            "timed_out": planning.timed_out,
        }
        plots.append(("torchrec", theirs, estimate))
    if args.plot:
        from lightning_embark.planner import plot_plans

        plot_plans(plots, args.plot)
        print(f"wrote {args.plot}")
    return doc


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        with quiet_torchrec_planner():
            doc = run(args)
    except EmbarkError as error:
        print(f"embark-plan: error: {error}", file=sys.stderr)
        return 2
    with open(args.out, "w") as handle:
        json.dump(doc, handle, indent=2)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
