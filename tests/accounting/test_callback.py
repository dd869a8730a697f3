"""Which DDP wrappers the accounting callback finds (and so counts)."""

from __future__ import annotations

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from lightning_embark.accounting._callback import ddp_modules


def _fake_ddp() -> DistributedDataParallel:
    """A DDP instance without a process group: only its type matters here."""
    return DistributedDataParallel.__new__(DistributedDataParallel)


def test_ddp_wrappers_in_plain_lists_are_found() -> None:
    """torchrec keeps the DDP wrappers of data-parallel lookups in a plain list (``_lookups``),
    out of ``.modules()``; their gradient all-reduce went uncounted before."""
    in_list, in_tuple = _fake_ddp(), _fake_ddp()
    sharded = nn.Module()
    sharded._lookups = [nn.Linear(2, 2), in_list]
    sharded._pairs = (in_tuple, in_list)
    root = nn.Sequential(sharded, nn.Linear(2, 2))
    assert [id(m) for m in ddp_modules(root)] == [id(in_list), id(in_tuple)]
    assert ddp_modules(nn.Linear(2, 2)) == []


def test_ddp_wrappers_below_a_module_hiding_its_children_are_found() -> None:
    """torchrec's sharded tower collection answers ``named_modules()`` with itself alone, so
    ``.modules()`` never reaches the DDP wrapper of a tower module; its intra-host gradient
    all-reduce went uncounted before."""

    class Hiding(nn.Module):
        def named_modules(self, memo=None, prefix="", remove_duplicate=True):
            yield prefix, self

    tower_ddp = _fake_ddp()
    nn.Module.__init__(tower_ddp)  # a registrable child, still without a process group
    hiding = Hiding()
    hiding.interactions = nn.ModuleDict({"0": tower_ddp})  # torchrec's layout
    root = nn.Sequential(nn.Linear(2, 2), hiding)
    assert all(m is not tower_ddp for m in root.modules())
    assert [id(m) for m in ddp_modules(root)] == [id(tower_ddp)]


def test_the_input_pipelines_waits_are_not_the_steps() -> None:
    """Blocked time under the pipeline's label ran on its own thread while the step
    computed: it is embedding traffic, but out of the step's blocked share."""
    from lightning_embark._traffic import AHEAD
    from lightning_embark.accounting._callback import StepRecord
    from lightning_embark.accounting._counter import CommCounter

    counter = CommCounter(rank=0, ranks_per_host=1)
    counter.add_blocked("all_to_all_single", 0.25)
    counter.add_blocked("all_to_all_single", 0.5, traffic=AHEAD)
    record = StepRecord(seconds=2.0, comm=counter.snapshot())
    assert record.embedding_exchange_seconds == 0.25
    assert record.embedding_comm_share == 0.125


def test_a_steps_time_includes_fetching_its_batch() -> None:
    """Lightning fetches a batch before ``on_train_batch_start`` and torchrec's train pipeline
    inside the step: a step runs from the end of the one before, so a loader that sleeps
    ``s`` per batch adds ``s`` to every step after the first, whoever fetches (Lightning's
    prefetcher fetches one batch ahead, in the step before). The bound: each of those steps
    is at least the sleep (``time.sleep`` never returns early)."""
    import time

    import lightning.pytorch as pl
    import torch

    from lightning_embark.accounting import CommAccountingCallback

    sleep = 0.05

    class SlowBatches(torch.utils.data.IterableDataset):
        def __iter__(self):
            for _ in range(8):  # more than the run takes: every fetch sleeps
                time.sleep(sleep)
                yield torch.ones(2, 2)

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.Linear(2, 1)

        def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
            return self.layer(batch).sum()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    accounting = CommAccountingCallback(log=False, ranks_per_host=1)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=4,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[accounting],
    )
    trainer.fit(Tiny(), torch.utils.data.DataLoader(SlowBatches(), batch_size=None))
    seconds = [s.seconds for s in accounting.steps]
    assert len(seconds) == 4
    assert all(s >= sleep for s in seconds[1:]), seconds
