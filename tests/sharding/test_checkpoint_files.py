"""A damaged checkpoint directory is reported by file: missing, truncated or corrupt."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from lightning_embark.errors import CheckpointError, ConfigError
from lightning_embark.models import DLRMModule
from lightning_embark.plan import ClusterPlan, ClusterType, Plan, layouts
from lightning_embark.sharding import read_tables
from lightning_embark.strategies import EmbarkStrategy
from lightning_embark.testing import quiet_trainer

PLAN = Plan(
    world_size=1,
    ranks_per_host=1,
    clusters=(ClusterPlan(name="rb", type=ClusterType.RB),),
    tables=tuple(layouts.table_wise(f"f{i}", "rb", 0) for i in range(4)),
)


def _fit(synthetic: Any, ckpt_path: Path | None = None, steps: int = 1) -> Any:
    spec = synthetic.tiny_spec(rows=90, dim=8)
    torch.manual_seed(0)
    model = DLRMModule(spec, dense_arch_layer_sizes=[8], over_arch_layer_sizes=[8, 1])
    batches = synthetic.synthetic_batches(spec, num_batches=1, batch_size=8, seed=1)
    trainer = quiet_trainer(
        strategy=EmbarkStrategy(plan=PLAN),
        devices=1,
        max_steps=steps,
        use_distributed_sampler=False,
    )
    trainer.fit(
        model, DataLoader(synthetic.BatchDataset(batches), batch_size=None), ckpt_path=ckpt_path
    )
    return trainer


@pytest.fixture
def checkpoint(single_rank_world, synthetic: Any, tmp_path: Path) -> Path:
    _fit(synthetic).save_checkpoint(tmp_path / "ckpt")
    return tmp_path / "ckpt"


def _copy(checkpoint: Path, name: str) -> Path:
    target = checkpoint.parent / name
    shutil.copytree(checkpoint, target)
    return target


def _truncate(file: Path) -> None:
    file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])


def test_a_truncated_data_file_is_named_with_its_sizes(checkpoint: Path) -> None:
    assert read_tables(checkpoint)  # intact, it reads
    damaged = _copy(checkpoint, "truncated")
    (data,) = damaged.glob("*.distcp")
    size = data.stat().st_size
    _truncate(data)
    with pytest.raises(CheckpointError) as info:
        read_tables(damaged)
    message = str(info.value)
    assert f"checkpoint file {str(data)!r} is truncated: it has {size // 2} bytes" in message
    assert f"checkpoint directory {str(damaged)!r}" in message
    assert isinstance(info.value, ConfigError)
    data.unlink()
    with pytest.raises(CheckpointError, match=rf"{data.name}' is missing"):
        read_tables(damaged)


def test_corrupt_bytes_in_a_data_file_name_the_directory(checkpoint: Path) -> None:
    damaged = _copy(checkpoint, "corrupt")
    (data,) = damaged.glob("*.distcp")
    data.write_bytes(bytes(data.stat().st_size))  # same length, all zeros
    with pytest.raises(CheckpointError) as info:
        read_tables(damaged)
    message = str(info.value)
    assert f"checkpoint directory {str(damaged)!r} cannot be read" in message
    assert "corrupt" in message


def test_a_truncated_metadata_file_is_named(checkpoint: Path) -> None:
    damaged = _copy(checkpoint, "metadata")
    _truncate(damaged / ".metadata")
    with pytest.raises(CheckpointError) as info:
        read_tables(damaged)
    message = str(info.value)
    assert f"checkpoint file {str(damaged / '.metadata')!r} cannot be read" in message
    assert "truncated or corrupt" in message and f"directory {str(damaged)!r}" in message


def test_resuming_from_a_truncated_meta_file_names_it(checkpoint: Path, synthetic: Any) -> None:
    damaged = _copy(checkpoint, "meta")
    _truncate(damaged / "meta.pt")
    with pytest.raises(CheckpointError) as info:
        _fit(synthetic, ckpt_path=damaged, steps=2)
    message = str(info.value)
    assert f"checkpoint file {str(damaged / 'meta.pt')!r} cannot be read" in message
    assert "truncated or corrupt" in message and "PytorchStreamReader" in message
