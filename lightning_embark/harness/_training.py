"""The model, data and Trainer every benchmark and tuning run trains: one definition, so
``embark-bench``'s ranks and ``embark-tune``'s trials time the same thing."""

from __future__ import annotations

import os
from typing import Any

import torch


def _sizes(text: str) -> list[int]:
    from lightning_embark.lists import parse_list

    return list(parse_list(text, int, what="MLP sizes"))


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
