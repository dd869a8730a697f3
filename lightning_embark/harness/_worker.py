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


def _sizes(text: str) -> list[int]:
    from lightning_embark.lists import parse_list

    return list(parse_list(text, int, what="MLP sizes"))


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


def bench_model(
    spec: Any,
    *,
    interaction: str,
    dense_arch: str,
    over_arch: str,
    seed: int,
    towers: str | None = None,
) -> Any:
    """The DLRM every benchmark and tuning run trains: the same seed gives the same weights
    (with ``towers``, a ``towers.json``: the DLRM over those towers, :class:`TowerDLRM`).

    Raises:
        ConfigError: the spec's tables differ in width (the DLRM interaction needs one).
    """
    import lightning.pytorch as pl

    from lightning_embark.errors import ConfigError
    from lightning_embark.models import DLRMConfig, DLRMModule

    dims = {t.embedding_dim for t in spec.tables}
    if len(dims) != 1:
        raise ConfigError(f"DLRM needs one embedding width; {spec.name} has {sorted(dims)}")
    (dim,) = dims
    config = DLRMConfig(
        dense_arch_layer_sizes=(*_sizes(dense_arch), dim),
        over_arch_layer_sizes=tuple(_sizes(over_arch)),
        interaction=interaction,
        towers=towers,
    )
    pl.seed_everything(seed, verbose=False)
    return DLRMModule(spec, config=config)


def bench_data(
    spec: Any,
    *,
    batch_size: int,
    num_batches: int,
    seed: int,
    rank: int,
    world_size: int,
    first_batch: int = 0,
) -> Any:
    """This rank's synthetic batches, made before training: the same seed replays the
    same batches.

    The generator hashes every ID in Python-driven numpy calls per table; at a small batch
    it costs a CPU rank more than the step it feeds (T510 at 8 samples per rank: about
    half of torchrec's step on the emulated cluster). A user's loader runs in worker
    processes on cores of its own; here the ranks share two cores, so generating inside
    the loop would time the generator, and time it where each strategy happens to fetch.
    Made up front, every strategy's loop reads a list.
    """
    from torch.utils.data import DataLoader

    from lightning_embark.data import SyntheticDataset

    data = SyntheticDataset(
        spec,
        batch_size=batch_size,
        num_batches=num_batches,
        seed=seed,
        rank=rank,
        world_size=world_size,
        first_batch=first_batch,
    )
    return DataLoader(_Batches(list(data)), batch_size=None)


class _Batches(torch.utils.data.Dataset):
    """Batches already made, served in order (a map-style dataset over a list)."""

    def __init__(self, batches: list[Any]) -> None:
        self.batches = batches

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, index: int) -> Any:
        return self.batches[index]


def bench_trainer(
    strategy: Any,
    *,
    num_hosts: int,
    ranks_per_host: int,
    max_steps: int,
    callbacks: list[Any],
) -> Any:
    """A Trainer that trains ``max_steps`` steps and writes nothing (no logger, checkpoint,
    progress bar: Lightning's bar on every rank, relayed line by line, would interleave with
    rank 0's :class:`~._progress.StepProgress` and fill a log with kilobyte-long lines).

    Lightning's devices and nodes follow the launcher (torchrun's ``LOCAL_WORLD_SIZE``):
    on loopback every emulated host's ranks share one torchrun, while the strategy still
    reads the emulated hosts from ``EMBARK_RANKS_PER_HOST``.
    """
    import lightning.pytorch as pl

    world = num_hosts * ranks_per_host
    local = int(os.environ.get("LOCAL_WORLD_SIZE", ranks_per_host))
    return pl.Trainer(
        accelerator="cpu",
        devices=local,
        num_nodes=max(1, world // local),
        strategy=strategy,
        max_steps=max_steps,
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=False,  # rank 0's StepProgress is the bench's one bar
        use_distributed_sampler=False,
        num_sanity_val_steps=0,
        callbacks=callbacks,
    )


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
