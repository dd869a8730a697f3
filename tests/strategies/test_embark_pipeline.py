"""``EmbarkStrategy(pipeline=True)``: the same training, bit for bit, with IDs sent a step ahead
(and with the clusters' exchanges on the engine's lane too, ``overlap=True``).

Both runs do the same floating-point operations on the same values in the same order: the
pipeline changes only when and over which process group a batch's IDs travel, never what
is computed from them. So every step's loss and every weight after training must be equal,
not close. The run validates midway, so the pipeline also meets the batch Lightning's
fetcher took before validation, and a validation batch it never prefetched.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from lightning_embark.models import DLRMModule
from lightning_embark.plan import layouts
from lightning_embark.plan._types import ClusterPlan, ClusterType, Compression, Plan
from lightning_embark.sharding import PrefetchingLoader
from lightning_embark.strategies import EmbarkStrategy
from lightning_embark.testing import LossRecorder, quiet_trainer
from lightning_embark.testing._ranks import run_gloo_ranks

STEPS = 20
BATCH = 16


def _plan(world: int) -> Plan:
    """RB (hierarchical, fp16 wire), UB (row-wise) and DP clusters on 2 x 2 ranks."""
    return Plan(
        world_size=world,
        ranks_per_host=2,
        clusters=(
            ClusterPlan(name="dp", type=ClusterType.DP),
            ClusterPlan(
                name="rb",
                type=ClusterType.RB,
                hierarchical=True,
                forward_compression=Compression.FP16,
                backward_compression=Compression.FP16,
            ),
            ClusterPlan(name="ub", type=ClusterType.UB),
        ),
        tables=(
            layouts.table_wise("f0", "rb", world - 1),
            layouts.row_wise("f1", "rb", range(world)),
            layouts.row_wise("f2", "ub", range(world)),
            layouts.data_parallel("f3", "dp", world),
        ),
    )


def _fit(
    model: DLRMModule,
    world: int,
    batches: list[Any],
    val: list[Any],
    *,
    pipeline: bool,
    overlap: bool = False,
) -> tuple[list[torch.Tensor], EmbarkStrategy]:
    record = LossRecorder()
    strategy = EmbarkStrategy(plan=_plan(world), pipeline=pipeline, overlap=overlap)
    trainer = quiet_trainer(
        strategy=strategy,
        devices=world,
        max_steps=STEPS,
        use_distributed_sampler=False,
        callbacks=[record],
        val_check_interval=STEPS // 2,
        limit_val_batches=2,
        num_sanity_val_steps=1,
    )
    loader = DataLoader(_Listed(batches), batch_size=None)
    trainer.fit(model, loader, DataLoader(_Listed(val), batch_size=None))
    return record.losses, strategy


class _Listed(torch.utils.data.Dataset):
    def __init__(self, items: list[Any]) -> None:
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> Any:
        return self.items[index]


def check_same_training(rank: int, world: int, synthetic: Any) -> None:
    spec = synthetic.tiny_spec(rows=300)
    batches = synthetic.synthetic_batches(spec, num_batches=STEPS, batch_size=BATCH, seed=rank)
    val = synthetic.synthetic_batches(spec, num_batches=2, batch_size=BATCH, seed=50 + rank)
    torch.manual_seed(0)
    model = DLRMModule(
        spec, dense_arch_layer_sizes=[16], over_arch_layer_sizes=[16, 1], sparse_lr=0.1
    )
    model.materialize_embeddings()
    twin = copy.deepcopy(model)
    triplet = copy.deepcopy(model)

    plain_losses, plain = _fit(model, world, batches, val, pipeline=False)
    piped_losses, piped = _fit(twin, world, batches, val, pipeline=True)
    # The pipeline and the lane together: the last backward's updates run past each step.
    lane_losses, _ = _fit(triplet, world, batches, val, pipeline=True, overlap=True)

    assert len(piped_losses) == STEPS
    assert torch.equal(torch.stack(piped_losses), torch.stack(plain_losses))
    assert torch.equal(torch.stack(lane_losses), torch.stack(plain_losses))
    for (name, a), (_, b), (_, c) in zip(
        model.state_dict().items(),
        twin.state_dict().items(),
        triplet.state_dict().items(),
        strict=True,
    ):
        assert torch.equal(a, b), name
        assert torch.equal(a, c), name
    for path, module in piped.sharded_modules.items():
        other = plain.sharded_modules[path]
        for x, y in zip(module.local_shards(), other.local_shards(), strict=True):
            assert torch.equal(x.weight, y.weight)
        # Every training step found its IDs sent ahead; the validation lookups did not.
        hits, misses = module.pipeline_counts
        assert hits == STEPS, (hits, misses)
        assert misses == 1 + 2 + 2  # sanity check, mid-run and final validation batches


@pytest.mark.multiprocess
def test_pipelined_training_is_bit_identical(synthetic) -> None:
    run_gloo_ranks(check_same_training, 4, synthetic)


def test_prefetching_loader_is_the_loader_but_for_iteration() -> None:
    taken: list[int] = []
    active = [False]
    loader = DataLoader(list(range(5)), batch_size=2)
    wrapped = PrefetchingLoader(
        loader, lambda b: taken.append(int(b.sum())) or b * 10, lambda: active[0]
    )
    assert len(wrapped) == 3 and wrapped.batch_size == 2 and wrapped.dataset is loader.dataset
    assert [b.tolist() for b in wrapped] == [[0, 1], [2, 3], [4]]  # not training: as is
    active[0] = True
    assert [b.tolist() for b in wrapped] == [[0, 10], [20, 30], [40]]
    assert taken == [1, 5, 4]


def test_pipeline_option_is_checked() -> None:
    from lightning_embark.errors import ConfigError

    with pytest.raises(ConfigError, match="pipeline must be True or False, got 'yes'"):
        EmbarkStrategy(pipeline="yes")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="overlap must be True or False, got 1"):
        EmbarkStrategy(overlap=1)  # type: ignore[arg-type]
