"""One rank of a benchmark run: train a strategy on synthetic data and record each step.

Launched by :mod:`lightning_embark.cli.embark_bench` (and ``make demo``) under torchrun on
every emulated host as ``_worker.py JOB.json``: the run is a :class:`~._config.RankJob`
(the bench's config whole, the strategy, where to write), read from the file, not parsed
from a second command line. It reads the world from torchrun's environment and the
rank-to-host map from ``EMBARK_RANKS_PER_HOST``, and writes ``rank{R}.json`` into the
job's ``out_dir``. Rank 0
shows a progress bar over the run's steps (:class:`~._progress.StepProgress`).
"""

from __future__ import annotations

import json
import os
import resource
import sys
from pathlib import Path
from typing import Any

import torch

from lightning_embark.harness._config import TOWER_RUNS, TOWERED_BASELINES, RankJob
from lightning_embark.harness._training import bench_data, bench_model, bench_trainer


def bench_towers(job: RankJob, spec: Any, world_size: int) -> list[Any]:
    """A tower run's (:data:`TOWER_RUNS`) tower requests: the config's ``towers`` read or
    partitioned under the run's cost model (the automatic plan's), with the run's tower
    module and ratio. Every rank computes the same requests (no data involved)."""
    from lightning_embark.plan import Compression, TowerModule
    from lightning_embark.planner import resolve_towers
    from lightning_embark.sharding import planning_model
    from lightning_embark.topology import resolve_topology

    topology = resolve_topology(None, world_size=world_size)
    model = planning_model(spec, topology, batch_size=job.config.batch_size)
    return resolve_towers(  # a towers file comes with module identity and no ratio
        model,
        job.config.towers,
        module=TowerModule(job.tower_module),
        output_ratio=job.tower_ratio,
        compression=Compression(job.config.tower_compression),
    )


def build_strategy(job: RankJob, towers: list[Any] | None = None) -> Any:
    """The Trainer's ``strategy`` as a user would configure it for this run.

    torchrec strategies get the run's per-rank batch for their planner's cost model
    (torchrec assumes 512 otherwise); every strategy takes the config's dense wire format
    (:attr:`~._config.BenchConfig.dense_format`), its dense exchange (its own when None) and
    ``pipeline`` (torchrec's ``TrainPipelineSparseDist`` or embark's input pipeline; not the
    towered baselines); the embark runs take ``overlap``; ``embark`` takes the plan options;
    ``embark-torchrec-plan`` executes torchrec's planner's plan (fp32) on the engine;
    ``embark-towers`` plans identity ``towers`` over the plain model, or plans the
    model's own tower collection (compressing towers are part of the model); a
    :data:`TOWERED_BASELINES` run is its registered strategy (over the towered model).
    """
    from lightning_embark.registry import STRATEGIES

    _description, init_params = STRATEGIES[TOWERED_BASELINES.get(job.strategy, job.strategy)]
    if job.strategy.startswith("torchrec"):
        from lightning_embark.strategies import TorchrecStrategy

        options = dict(init_params)
        options["dense_compression"] = job.config.dense_format
        if job.config.dense_exchange is not None:
            options["dense_exchange"] = job.config.dense_exchange
        if job.config.pipeline and job.strategy not in TOWERED_BASELINES:
            options["pipeline"] = True
        return TorchrecStrategy(batch_size=job.config.batch_size, **options)
    from lightning_embark.strategies import EmbarkStrategy

    allow = list(job.config.allow) or None
    exchange = job.config.dense_exchange
    own: dict[str, Any] = {} if exchange is None else {"dense_exchange": exchange}
    if job.strategy == "embark":
        return EmbarkStrategy(
            plan=job.config.plan,
            allow=allow,
            dense_compression=job.config.dense_format,
            pipeline=job.config.pipeline,
            overlap=job.config.overlap,
            **own,
        )
    if job.strategy == "embark-towers":
        identity = towers is not None and all(t.module.value == "identity" for t in towers)
        return EmbarkStrategy(
            allow=allow,
            dense_compression=job.config.dense_format,
            towers=towers if identity else "auto",  # "auto": the model's tower collection
            pipeline=job.config.pipeline,
            overlap=job.config.overlap,
        )
    return EmbarkStrategy(
        dense_compression=job.config.dense_format,
        pipeline=job.config.pipeline,
        overlap=job.config.overlap,
        **own,
        **init_params,
    )


def _pipelined(strategy: Any) -> bool:
    """Whether ``strategy`` trained through an input pipeline that pipelined something."""
    train_pipeline = getattr(strategy, "_train_pipeline", None)
    if train_pipeline is not None:
        return bool(getattr(train_pipeline, "_pipelined_modules", None))
    modules = getattr(strategy, "sharded_modules", {})
    return any(m.pipelined and m.pipeline_counts[0] > 0 for m in modules.values())


def main(argv: list[str] | None = None) -> int:
    from lightning_embark._leave import leave_process_groups

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        raise SystemExit(f"usage: {Path(__file__).name} JOB.json (a RankJob), got {args}")
    _train(
        RankJob.from_json(Path(args[0]).read_text())
    )  # the run's objects, and the process groups they hold, end here
    leave_process_groups()
    return 0


def _train(job: RankJob) -> None:
    """The run: train, write this rank's record, release the strategy's groups."""
    torch.set_num_threads(1)
    import lightning.pytorch as pl

    from lightning_embark._logs import quiet_known_third_party, quiet_lightning_banners
    from lightning_embark.accounting import CommAccountingCallback
    from lightning_embark.harness._progress import StepProgress
    from lightning_embark.registry import register_strategies
    from lightning_embark.spec import load_spec
    from lightning_embark.topology import ranks_per_host_from_env

    register_strategies()
    quiet_lightning_banners()
    quiet_known_third_party()  # the batches are made before any strategy quiets torchrec
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    ranks_per_host = ranks_per_host_from_env(world_size)
    num_hosts = max(1, world_size // ranks_per_host)
    spec = load_spec(job.config.model, max_rows=job.config.max_rows)
    if rank == 0:
        print(f"{job.strategy}: {spec.describe()}", flush=True)
    towers = bench_towers(job, spec, world_size) if job.strategy in TOWER_RUNS else None
    towers_file = None
    in_model = job.strategy in TOWERED_BASELINES  # torchrec shards only a model's towers
    if towers is not None and (in_model or any(t.module.value != "identity" for t in towers)):
        from lightning_embark.plan import save_towers

        # Compressing towers are part of the model: DLRMModule reads them from a file.
        job.out_dir.mkdir(parents=True, exist_ok=True)
        towers_file = job.out_dir / f"towers{rank}.json"
        save_towers(towers, towers_file)
    model = bench_model(
        spec,
        interaction=job.config.interaction,
        dense_arch=job.config.dense_arch,
        over_arch=job.config.over_arch,
        seed=job.config.seed,
        towers=None if towers_file is None else str(towers_file),
    )
    total_steps = job.config.warmup + job.config.steps
    train = bench_data(
        spec,
        batch_size=job.config.batch_size,
        num_batches=total_steps,
        seed=job.config.seed,
        rank=rank,
        world_size=world_size,
    )
    # Records only: the Trainer has no logger, and logging numbers through Lightning makes a
    # device tensor of each, every step (a host-to-device copy per number on a GPU).
    accounting = CommAccountingCallback(ranks_per_host=ranks_per_host, log=False)
    callbacks: list[pl.Callback] = [accounting]
    engine_metrics = None
    if job.strategy.startswith("embark"):
        from lightning_embark.sharding import EmbarkMetricsCallback

        # Engine forward/backward time per step; no per-step unique ratios (torch.unique
        # per table would add to the very step time being compared).
        engine_metrics = EmbarkMetricsCallback(unique_ratios=False, log=False)
        callbacks.append(engine_metrics)
    if job.config.profile and engine_metrics is not None:
        from lightning_embark.harness._profile import label_cluster_phases

        class _LabelPhases(pl.Callback):
            """Labels the engine's clusters once the strategy has built them."""

            def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
                if not label_cluster_phases(trainer.strategy.model or pl_module):
                    raise RuntimeError("--profile: no engine cluster found in the model")

        callbacks.append(_LabelPhases())
    dispatch = None
    if job.config.profile:
        from lightning_embark.accounting import DispatchCountCallback
        from lightning_embark.harness._profile import dispatch_step

        dispatch = DispatchCountCallback(step=dispatch_step(job.config.warmup))
        callbacks.append(dispatch)
    if rank == 0:
        title = job.name
        callbacks.append(
            StepProgress(
                title=f"{title} ({job.position})" if job.position else title,
                total=total_steps,
                warmup=job.config.warmup,
            )
        )
    trainer = bench_trainer(
        build_strategy(job, towers),
        num_hosts=num_hosts,
        ranks_per_host=ranks_per_host,
        max_steps=total_steps,
        callbacks=callbacks,
    )
    trainer.fit(model, train)
    record = {
        "rank": rank,
        "host": rank // ranks_per_host,
        "strategy": job.strategy,
        "batch_size": job.config.batch_size,
        "step_seconds": [s.seconds for s in accounting.steps],
        "cpu_seconds": [s.cpu_seconds for s in accounting.steps],
        "embedding_share": [s.embedding_comm_share for s in accounting.steps],
        "comm": [s.comm.to_dict() for s in accounting.steps],
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "spec": spec.describe(),
    }
    if engine_metrics is not None:
        record["engine_ms"] = engine_metrics.steps
    if dispatch is not None and dispatch.snapshot is not None:
        record["dispatch"] = {"step": dispatch.step, "counts": dispatch.snapshot.to_dict()}
    plan_summary = getattr(trainer.strategy, "plan_summary", None)
    if callable(plan_summary):
        record["plan_summary"] = plan_summary()
    # The dense gradients' wire format as resolved (embark: a Compression, torchrec: a str)
    # and how they cross ranks.
    dense = getattr(trainer.strategy, "dense_compression", None)
    if dense is not None:
        record["dense_compression"] = str(getattr(dense, "value", dense))
    exchange = getattr(trainer.strategy, "dense_exchange", None)
    if exchange is not None:
        record["dense_exchange"] = str(exchange)
    # Whether the step ran through an input pipeline that did its work (embark: every
    # training lookup found its IDs sent ahead; torchrec: the pipeline rewrote a module).
    record["pipelined"] = _pipelined(trainer.strategy)
    record["overlapped"] = any(
        m.overlapped for m in getattr(trainer.strategy, "sharded_modules", {}).values()
    )
    plan = getattr(trainer.strategy, "plan", None)
    if plan is not None and hasattr(plan, "to_dict"):  # the embark plan, so a run can be repeated
        record["plan"] = plan.to_dict()
    if job.config.val_batches:
        val = bench_data(
            spec,
            batch_size=job.config.batch_size,
            num_batches=job.config.val_batches,
            seed=job.config.seed,
            rank=rank,
            world_size=world_size,
            first_batch=total_steps,
        )
        metrics = trainer.validate(model, val, verbose=False)
        record["validation"] = {k: float(v) for k, v in metrics[0].items()} if metrics else {}
    job.out_dir.mkdir(parents=True, exist_ok=True)
    (job.out_dir / f"rank{rank}.json").write_text(json.dumps(record))
    release = getattr(trainer.strategy, "release", None)
    if callable(release):  # torchrec keeps its node groups for the process otherwise
        release()


if __name__ == "__main__":
    sys.exit(main())
