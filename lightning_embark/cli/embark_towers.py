"""``embark-towers``: DMT towers that keep interacting features together, as a towers.json.

The features are grouped under a load-balance cap.

With ``--data FILE`` (a Criteo DAC file, tab-separated label, I1..I13, C1..C26, hashed
into the spec's tables) the flat DLRM trains ``--warmup-steps`` steps on one process,
the feature affinity is read from it (:mod:`lightning_embark.planner._affinity`) and
the partitioner keeps the strongest pairs inside towers; ``--affinity FILE`` reuses a
measured one (``--affinity-out``). Without either the partition is statistics-only
(balanced estimated costs). It prints each tower's tables and estimated cost, the
balance (costliest tower over the mean), the affinity kept inside towers beside the
statistics-only partition's, and the plan's estimated step with these towers beside
the flat plan's; ``--plot`` draws the affinity matrix ordered by tower.

The towers file is what ``EmbarkStrategy(towers=...)``, ``DLRMModule(towers=...)``,
``embark-plan --towers`` and ``embark-bench --towers`` take.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from lightning_embark.errors import ConfigError, EmbarkError
from lightning_embark.lists import parse_list
from lightning_embark.plan import Compression, TowerModule, TowerRequest, save_towers
from lightning_embark.planner import (
    DEFAULT_SPARSE_OPTIMIZER,
    SPARSE_OPTIMIZER_KINDS,
    CostModel,
    FeatureAffinity,
    GreedyPlanner,
    kept_affinity,
    load_calibration,
    measure_affinity,
    partition_tables,
    plan_with_towers,
    plot_affinity,
    table_costs,
    with_sparse_optimizer,
)
from lightning_embark.spec import ModelSpec


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="embark-towers", description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="model spec JSON or preset")
    parser.add_argument("--data", help="Criteo DAC file for the warm-up run")
    parser.add_argument("--affinity", help="affinity JSON (from --affinity-out) instead of --data")
    parser.add_argument("--hosts", type=int, required=True, help="number of hosts")
    parser.add_argument("--ranks-per-host", type=int, required=True, help="ranks per host")
    parser.add_argument(
        "--towers", type=int, default=None, help="number of towers (default: one per host)"
    )
    parser.add_argument("--batch-size", type=int, default=128, help="per-rank batch size")
    parser.add_argument(
        "--warmup-steps", type=int, default=200, help="steps of the flat warm-up run (default 200)"
    )
    parser.add_argument(
        "--balance",
        type=float,
        default=1.25,
        help="cap of a tower's estimated cost over the mean tower cost (default 1.25)",
    )
    parser.add_argument("--seed", type=int, default=0, help="warm-up and partition seed")
    parser.add_argument(
        "--tower-module",
        choices=[m.value for m in TowerModule if m is not TowerModule.CUSTOM],
        default="identity",
        help="module of every tower (default identity)",
    )
    parser.add_argument(
        "--tower-ratio", type=float, default=None, help="D_t / O_t of a compressing tower module"
    )
    parser.add_argument(
        "--tower-compression",
        choices=[c.value for c in Compression],
        default="fp32",
        help="wire format of the tower outputs crossing hosts",
    )
    parser.add_argument(
        "--topology", default="emulated", help="calibration preset or calibration JSON"
    )
    parser.add_argument(
        "--sparse-optimizer",
        choices=SPARSE_OPTIMIZER_KINDS,
        default=DEFAULT_SPARSE_OPTIMIZER,
        help="the embedding optimizer, whose state the memory counts",
    )
    parser.add_argument("--max-rows", type=int, default=None, help="cap every table's rows")
    parser.add_argument(
        "--interaction",
        choices=("dot", "dcn"),
        default="dot",
        help="the warm-up model's interaction, whose pair terms give the affinity (default dot)",
    )
    parser.add_argument("--dense-arch", default="64", help="bottom MLP hidden sizes")
    parser.add_argument("--over-arch", default="64,32,1", help="top MLP sizes (ends at 1)")
    parser.add_argument("--plot", help="PNG of the affinity matrix ordered by tower")
    parser.add_argument("--affinity-out", help="write the measured affinity as JSON")
    parser.add_argument("--out", required=True, help="towers JSON to write")
    return parser


def _sizes(flag: str, text: str) -> list[int]:
    sizes = list(parse_list(text, int, what=flag))
    if not sizes or min(sizes) < 1:
        raise ConfigError(f"{flag} {text!r}: expected positive layer sizes, e.g. 64,32,1")
    return sizes


def warm_up_affinity(args: argparse.Namespace, spec: ModelSpec) -> FeatureAffinity:
    """Train the flat DLRM ``--warmup-steps`` steps on ``--data`` (single process) and
    measure its feature affinity on the first training batches."""
    import lightning
    from torch.utils.data import DataLoader

    from lightning_embark.data import CriteoDataset
    from lightning_embark.models import DLRMModule

    if args.warmup_steps < 1:
        raise ConfigError(f"--warmup-steps must be positive, got {args.warmup_steps}")
    dim = spec.tables[0].embedding_dim
    data = CriteoDataset(
        args.data,
        num_embeddings=spec,
        batch_size=args.batch_size,
        split="train",
        val_fraction=0.2,
        seed=0,
        drop_last=True,
    )
    lightning.seed_everything(args.seed, verbose=False)
    module = DLRMModule(
        spec,
        interaction=args.interaction,
        dense_arch_layer_sizes=[*_sizes("--dense-arch", args.dense_arch), dim],
        over_arch_layer_sizes=_sizes("--over-arch", args.over_arch),
        dcn_low_rank_dim=min(512, 4 * dim),
        dense_lr=0.05,
        sparse_lr=0.02,
    )
    trainer = lightning.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=args.warmup_steps,
        max_epochs=-1,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    trainer.fit(module, DataLoader(data, batch_size=None))
    if trainer.global_step < args.warmup_steps:
        raise ConfigError(
            f"--data {args.data!r}: the warm-up ran {trainer.global_step} of "
            f"{args.warmup_steps} steps (too few batches of {args.batch_size})"
        )
    module.eval()
    return measure_affinity(
        module.model,
        iter(data),
        source=f"{args.warmup_steps} warm-up steps ({args.interaction}) on {args.data}",
    )


def report(
    model: CostModel,
    towers: Sequence[TowerRequest],
    affinity: FeatureAffinity | None,
    baseline: Sequence[TowerRequest],
) -> list[str]:
    """The lines printed: towers, costs, balance, kept affinity, estimated steps."""
    names = [t for tower in towers for t in tower.tables]
    costs = table_costs(model, names)
    loads = [sum(costs[n] for n in tower.tables) for tower in towers]
    mean = sum(loads) / len(loads)
    lines = [f"{'tower':<10}{'tables':>7}{'est ms':>9}{'/ mean':>8}  features"]
    for tower, load in zip(towers, loads, strict=True):
        shown = ", ".join(tower.tables[:8]) + (" ..." if len(tower.tables) > 8 else "")
        lines.append(
            f"{tower.name:<10}{len(tower.tables):>7}{1e3 * load:>9.3f}{load / mean:>8.2f}  {shown}"
        )
    flat = [t.name for t in model.spec.tables if t.name not in set(names)]
    lines.append(f"balance: costliest tower {max(loads) / mean:.2f}x the mean; {len(flat)} flat")
    if affinity is not None:
        lines.append(
            f"affinity kept inside towers: {_kept(affinity, towers):.1%} (statistics-only "
            f"partition: {_kept(affinity, baseline):.1%}); from {affinity.source}"
        )
    planner = GreedyPlanner()
    with_towers = plan_with_towers(model, towers, planner).estimate.step_time_ms
    flat_step = planner.plan(model).estimate.step_time_ms
    lines.append(
        f"estimated step: {with_towers:.3f} ms with these towers, {flat_step:.3f} ms flat "
        f"({with_towers / flat_step:.2f}x)"
    )
    return lines


def _kept(affinity: FeatureAffinity, towers: Sequence[TowerRequest]) -> float:
    names = list(affinity.features)
    index = {n: i for i, n in enumerate(names)}
    return kept_affinity(
        affinity.matrix, [[index[t] for t in tower.tables if t in index] for tower in towers]
    )


def run(args: argparse.Namespace) -> list[str]:
    """Partition, write the towers (and plot); returns the report's lines."""
    from lightning_embark.spec import load_spec

    if args.data and args.affinity:
        raise ConfigError("give --data (measure the affinity) or --affinity (reuse one), not both")
    if args.plot and not (args.data or args.affinity):
        raise ConfigError("--plot draws the affinity: give --data or --affinity")
    module = TowerModule(args.tower_module)
    if module is not TowerModule.IDENTITY and args.tower_ratio is None:
        raise ConfigError(f"--tower-module {module.value} needs --tower-ratio R (e.g. 4)")
    if module is TowerModule.IDENTITY and args.tower_ratio is not None:
        raise ConfigError(
            "--tower-ratio needs a compressing --tower-module (projection, dcn, dot)"
        )
    spec = load_spec(args.model, max_rows=args.max_rows)
    calib = with_sparse_optimizer(load_calibration(args.topology), args.sparse_optimizer)
    model = CostModel(
        spec,
        calib,
        num_hosts=args.hosts,
        ranks_per_host=args.ranks_per_host,
        batch_size=args.batch_size,
    )
    affinity = (
        warm_up_affinity(args, spec)
        if args.data
        else FeatureAffinity.load(args.affinity)
        if args.affinity
        else None
    )
    if affinity is not None and args.affinity_out:
        affinity.save(args.affinity_out)
    options = dict(
        module=module,
        output_ratio=args.tower_ratio,
        compression=Compression(args.tower_compression),
    )
    count = args.towers if args.towers is not None else args.hosts
    towers = partition_tables(
        model, count, affinity=affinity, balance=args.balance, seed=args.seed, **options
    )
    baseline = partition_tables(model, count, balance=args.balance, **options)
    lines = report(model, towers, affinity, baseline)
    if affinity is None:
        lines.append("statistics-only: no --data or --affinity, so no feature affinity")
    save_towers(towers, args.out)
    lines.append(f"wrote {args.out}")
    if args.plot:
        assert affinity is not None  # checked above
        plot_affinity(affinity, towers, args.plot, title=f"{spec.name}: {Path(args.out).name}")
        lines.append(f"wrote {args.plot}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        lines = run(args)
    except EmbarkError as error:
        print(f"embark-towers: error: {error}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
