"""``TorchrecStrategy(pipeline=True)``: torchrec's ``TrainPipelineSparseDist`` drives the step.

torchrec's pipeline moves when a batch's KJT splits and IDs are exchanged, not what is
computed: the same lookups, the same dense forward and backward and the same optimizer
steps on the same batches. Both runs below use the same seeded model and data on 2 gloo
ranks, so every step's loss and the dense weights afterwards must be *equal*. The run
validates midway (the pipeline is detached and re-attached around it), and the pipeline
must have rewritten the sharded collection (else it would have run unpipelined, gaining
nothing).
"""

from __future__ import annotations

import copy
import os
from typing import Any

import pytest
import torch
from lightning.pytorch import Trainer
from torch import nn
from torch.utils.data import DataLoader
from torchrec.distributed.types import ShardingPlan

from lightning_embark.baseline._pipeline import (
    BatchLoss,
    LookaheadLoader,
    make_train_pipeline,
    plan_under_batch_loss,
)
from lightning_embark.errors import ConfigError
from lightning_embark.models import DLRMModule
from lightning_embark.strategies import TorchrecStrategy
from lightning_embark.testing import LossRecorder, quiet_trainer
from lightning_embark.testing._ranks import run_gloo_ranks

STEPS = 12


def _fit(
    model: DLRMModule, synthetic: Any, batches: list[Any], *, pipeline: bool
) -> tuple[list[torch.Tensor], Trainer]:
    record = LossRecorder()
    trainer = quiet_trainer(
        strategy=TorchrecStrategy(sharding_types=["table_row_wise"], pipeline=pipeline),
        devices=2,
        max_steps=STEPS,
        use_distributed_sampler=False,
        callbacks=[record],
        val_check_interval=STEPS // 2,
        limit_val_batches=2,
    )
    torch.manual_seed(1)  # DMP initialises the sharded tables afresh, from torch's RNG
    trainer.fit(
        model,
        DataLoader(synthetic.BatchDataset(batches), batch_size=None),
        DataLoader(synthetic.BatchDataset(batches[:2]), batch_size=None),
    )
    return record.losses, trainer


def check_same_training(rank: int, world: int, synthetic: Any) -> None:
    os.environ["EMBARK_RANKS_PER_HOST"] = "1"  # 2 emulated hosts x 1 rank
    spec = synthetic.tiny_spec(rows=300)
    batches = synthetic.synthetic_batches(spec, num_batches=STEPS, batch_size=16, seed=rank)
    torch.manual_seed(0)
    model = DLRMModule(spec, dense_arch_layer_sizes=[16], over_arch_layer_sizes=[16, 1])
    twin = copy.deepcopy(model)
    plain, _ = _fit(model, synthetic, batches, pipeline=False)
    piped, trainer = _fit(twin, synthetic, batches, pipeline=True)
    assert len(piped) == STEPS and trainer.global_step == STEPS
    pipeline = trainer.strategy._train_pipeline
    assert [type(m).__name__ for m in pipeline._pipelined_modules] == [
        "ShardedEmbeddingBagCollection"
    ]
    assert torch.equal(torch.stack(piped), torch.stack(plain))
    dense = {n: p for n, p in model.named_parameters() if "embedding" not in n}
    for name, value in twin.named_parameters():
        if name in dense:
            assert torch.equal(value, dense[name]), name


@pytest.mark.multiprocess
def test_torchrec_pipeline_trains_as_the_plain_loop(synthetic) -> None:
    run_gloo_ranks(check_same_training, 2, synthetic)


def test_batch_loss_wrapper_needs_batch_loss_and_routes_calls() -> None:
    with pytest.raises(ConfigError, match="has no batch_loss"):
        BatchLoss(nn.Linear(2, 2))

    class Module(nn.Module):
        def forward(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
            return x * scale

        def batch_loss(self, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return batch.sum(), batch + 1

    wrapper = BatchLoss(Module())
    x = torch.ones(3)
    assert torch.equal(wrapper(x, 2.0), 2 * x)  # Lightning's calls: the module itself
    wrapper.pipelined = True
    loss, (logged, output) = wrapper(x)  # torchrec's pipeline: (loss, output)
    assert float(loss) == 3.0 and float(logged) == 3.0 and torch.equal(output, x + 1)


def test_lookahead_loader_gives_both_cursors_the_same_batches() -> None:
    feeds: list[Any] = []
    loader = LookaheadLoader(DataLoader(list(range(6)), batch_size=2), feeds.append)
    assert len(loader) == 3 and loader.batch_size == 2
    ours = iter(loader)
    theirs = feeds[-1]
    # The pipeline reads two ahead of Lightning; both see every batch once, in order.
    assert [next(theirs).tolist(), next(theirs).tolist()] == [[0, 1], [2, 3]]
    assert [b.tolist() for b in ours] == [[0, 1], [2, 3], [4, 5]]
    assert [b.tolist() for b in theirs] == [[4, 5]]


def test_pipeline_option_is_checked() -> None:
    with pytest.raises(ConfigError, match="pipeline must be True or False"):
        TorchrecStrategy(pipeline=1)  # type: ignore[arg-type]


def test_a_plan_moves_under_the_wrapper_once_and_the_pipeline_takes_one_optimizer() -> None:
    """The moved paths are the wrapper's own module paths; a plan made for the wrapper stays;
    two optimizers are refused before torchrec's pipeline is built."""

    class Module(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ebc = nn.Linear(1, 1)

        def batch_loss(self, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return batch.sum(), batch

    wrapper = BatchLoss(Module())
    moved = plan_under_batch_loss(ShardingPlan({"ebc": {}}))
    assert list(moved.plan) == ["lightning_module.ebc"]
    assert set(moved.plan) <= set(dict(wrapper.named_modules()))
    assert plan_under_batch_loss(moved) is moved
    with pytest.raises(ConfigError, match="configure_optimizers gave 2"):
        make_train_pipeline(wrapper, [object(), object()], torch.device("cpu"))
