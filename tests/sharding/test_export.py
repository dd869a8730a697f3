"""A trained sharded model exported for serving: one file holding the full unsharded
``state_dict``, and a plain ``Trainer`` reading a checkpoint directory.

Two 4-rank runs (2 hosts x 2) train a few steps, then every rank exports
(``trainer.strategy.export``) and saves a checkpoint: one flat DLRM under a plan with a
hash-split RB grid, a column split, hash-split UB rows and a DP table, and one DLRM with
projection towers (a torchrec ``EmbeddingTowerCollection``). The tests then work in this
process alone.

Exactness. Export moves tensors and computes nothing, so every exported tensor must equal
its source bit for bit: the tables gathered from the ranks' blocks, the dense part and the
tower modules, and the same file from the checkpoint directory (``export_model``). Outputs
on one batch split into the two places where the unsharded model may compute differently:

* the pooled embeddings sum the same rows in another order (row shards add partial sums,
  fbgemm and ``nn.EmbeddingBag`` pool in their own order): within ``2 gamma(len - 1)
  sum(|w|)`` per element, with the tables themselves identical (``pooled_bound`` with a
  zero weight bound);
* the dense layers run the same fp32 operations on the same inputs on one thread, as the
  ranks do, so fed the sharded model's pooled vectors the unsharded model must return the
  sharded logits bit for bit.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor, KeyedTensor

from lightning_embark.errors import ConfigError
from lightning_embark.models import EMBEDDING_PATH, DLRMModule
from lightning_embark.plan import TowerRequest, layouts, save_towers
from lightning_embark.plan._types import ClusterPlan, ClusterType, Plan
from lightning_embark.registry import register_strategies
from lightning_embark.sharding import (
    EmbarkCheckpointIO,
    export_model,
    load_exported,
    read_tables,
)
from lightning_embark.strategies import EmbarkStrategy
from lightning_embark.testing import quiet_trainer
from lightning_embark.testing._ranks import run_gloo_ranks
from lightning_embark.testing._tolerance import assert_within, pooled_bound

WORLD, LOCAL, BATCH = 4, 2, 8
SMALL = dict(dense_arch_layer_sizes=[8], over_arch_layer_sizes=[8, 1], dense_lr=0.05)


def _spec(synthetic: Any) -> Any:
    return synthetic.tiny_spec(rows=90, dim=8)


def _model(spec: Any, towers: str | None = None) -> DLRMModule:
    torch.manual_seed(0)
    return DLRMModule(spec, towers=towers, sparse_lr=0.1, **SMALL)


def _plan() -> Plan:
    ranks = list(range(WORLD))
    return Plan(
        world_size=WORLD,
        ranks_per_host=LOCAL,
        clusters=(
            ClusterPlan(name="dp", type=ClusterType.DP),
            ClusterPlan(name="rb", type=ClusterType.RB, hierarchical=True),
            ClusterPlan(name="ub", type=ClusterType.UB, hierarchical=True),
        ),
        tables=(
            layouts.grid("f0", "rb", [ranks[:2], ranks[2:]]),
            layouts.column_wise("f1", "rb", ranks[1:3]),
            layouts.row_wise("f2", "ub", ranks),
            layouts.data_parallel("f3", "dp", WORLD),
        ),
    )


def _towers_file(out: Path) -> str:
    path = out / "towers.json"
    save_towers(
        [
            TowerRequest(name="a", tables=("f0", "f1"), module="projection", output_ratio=2.0),
            TowerRequest(name="b", tables=("f2",), module="projection", output_ratio=2.0),
        ],
        path,
    )
    return str(path)


def _eval_batch(synthetic: Any, spec: Any) -> Any:
    return synthetic.synthetic_batches(spec, num_batches=1, batch_size=24, seed=99)[0]


def _train_and_export(rank: int, world: int, synthetic: Any, out: Path, variant: str) -> None:
    register_strategies()
    os.environ["EMBARK_RANKS_PER_HOST"] = str(LOCAL)
    spec = _spec(synthetic)
    towers = str(out / "towers.json") if variant == "towers" else None
    model = _model(spec, towers)
    strategy = EmbarkStrategy(plan=_plan()) if towers is None else EmbarkStrategy()
    trainer = quiet_trainer(
        strategy=strategy, devices=world, max_steps=3, use_distributed_sampler=False
    )
    batches = synthetic.synthetic_batches(spec, num_batches=3, batch_size=BATCH, seed=rank)
    trainer.fit(model, DataLoader(synthetic.BatchDataset(batches), batch_size=None))
    trainer.strategy.export(out / variant / "model.pt")
    trainer.save_checkpoint(out / variant / "ckpt")
    reference: dict[str, Any] = {"dense": trainer.strategy.lightning_module_state_dict()}
    if towers is None:
        batch = _eval_batch(synthetic, spec)
        with torch.no_grad():
            pooled = model.embedding_modules()[EMBEDDING_PATH](batch.sparse_features)
            reference |= {
                "keys": pooled.keys(),
                "lengths": pooled.length_per_key(),
                "pooled": pooled.values(),
                "logits": model(batch.dense_features, batch.sparse_features),
            }
    if rank == 0:
        torch.save(reference, out / variant / "reference.pt")


@pytest.fixture(scope="module")
def exported(synthetic: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("embark_export")
    _towers_file(out)  # once, before the ranks read it
    for variant in ("flat", "towers"):
        run_gloo_ranks(_train_and_export, WORLD, synthetic, out, variant)
    return out


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """The ranks compute on one thread; so does the unsharded model here, for the same
    arithmetic."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class _Fixed(nn.Module):
    """Stands in for the embedding collection: returns the sharded model's pooled vectors."""

    def __init__(self, pooled: KeyedTensor) -> None:
        super().__init__()
        self.pooled = pooled

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        return self.pooled


def _assert_identical(actual: dict[str, Any], expected: dict[str, Any]) -> None:
    assert sorted(actual) == sorted(expected)
    for key, value in expected.items():
        assert actual[key].dtype == value.dtype and torch.equal(actual[key], value), key


@pytest.mark.multiprocess
@pytest.mark.parametrize("variant", ["flat", "towers"])
def test_the_export_is_the_unsharded_model_bit_for_bit(
    exported: Path, synthetic: Any, tmp_path: Path, variant: str
) -> None:
    spec = _spec(synthetic)
    towers = _towers_file(tmp_path) if variant == "towers" else None
    fresh = _model(spec, towers)
    assert fresh.embeddings_on_meta()
    state = torch.load(exported / variant / "model.pt", weights_only=True)
    # Every key of the unsharded module, and nothing else.
    assert sorted(state) == sorted(fresh.state_dict())
    # The same file from the checkpoint directory, in one process.
    _assert_identical(export_model(exported / variant / "ckpt", tmp_path / "again.pt"), state)
    # Tables as the checkpoint holds them; the dense part (tower modules included) as the
    # sharded module held it.
    reference = torch.load(exported / variant / "reference.pt", weights_only=False)
    for collection, tables in read_tables(exported / variant / "ckpt").items():
        for table, weight in tables.items():
            key = next(k for k in state if k.endswith(f".embedding_bags.{table}.weight"))
            assert key.startswith(collection) and torch.equal(state[key], weight), key
    dense = reference["dense"]
    renamed = {"towers.model_towers_0.": "towers.0.", "towers.model_towers_1.": "towers.1."}
    for key, value in dense.items():
        for old, new in renamed.items():
            key = key.replace(old, new)
        assert torch.equal(state[key], value), key
    if towers is not None:
        assert any(".towers.1.interaction." in k for k in state)


@pytest.mark.multiprocess
def test_a_meta_module_loads_the_export_and_computes_the_sharded_outputs(
    exported: Path, synthetic: Any
) -> None:
    spec = _spec(synthetic)
    reference = torch.load(exported / "flat" / "reference.pt", weights_only=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = load_exported(_model(spec), exported / "flat" / "model.pt")
    assert not [w for w in caught if "meta" in str(w.message)], [str(w.message) for w in caught]
    assert not model.embeddings_on_meta()
    assert not any(p.is_meta for p in model.parameters())
    batch = _eval_batch(synthetic, spec)
    ebc = model.embedding_modules()[EMBEDDING_PATH]
    with torch.no_grad():
        pooled = ebc(batch.sparse_features)
    assert pooled.keys() == reference["keys"]
    tables = {c.name: ebc.embedding_bags[c.name].weight for c in spec.embedding_bag_configs()}
    zero = {name: torch.zeros_like(w) for name, w in tables.items()}
    bound = pooled_bound(spec.embedding_bag_configs(), batch.sparse_features, tables, zero)
    assert_within(pooled.values(), reference["pooled"], bound, "pooled embeddings")
    # Fed the sharded model's pooled vectors, the dense layers give its logits exactly.
    model.model.sparse_arch.embedding_bag_collection = _Fixed(
        KeyedTensor(
            keys=reference["keys"],
            length_per_key=reference["lengths"],
            values=reference["pooled"],
        )
    )
    with torch.no_grad():
        logits = model(batch.dense_features, batch.sparse_features)
    assert torch.equal(logits, reference["logits"])


@pytest.mark.multiprocess
def test_a_plain_trainer_validates_a_checkpoint_directory_with_the_checkpoint_io(
    exported: Path, synthetic: Any, tmp_path: Path
) -> None:
    """No embark strategy, one process: with ``EmbarkCheckpointIO`` the module gets the
    exported weights, so validation computes what the exported model computes."""
    spec = _spec(synthetic)
    loader = DataLoader(synthetic.BatchDataset([_eval_batch(synthetic, spec)]), batch_size=None)
    trainer = quiet_trainer(plugins=[EmbarkCheckpointIO()])
    model = _model(spec)
    (metrics,) = trainer.validate(model, loader, ckpt_path=exported / "flat" / "ckpt")
    _assert_identical(
        model.state_dict(), torch.load(exported / "flat" / "model.pt", weights_only=True)
    )
    (expected,) = quiet_trainer().validate(
        load_exported(_model(spec), exported / "flat" / "model.pt"), loader
    )
    assert metrics == expected
    # Files still load as Lightning loads them; a directory of something else is named.
    trainer.save_checkpoint(tmp_path / "plain.ckpt")
    assert "state_dict" in EmbarkCheckpointIO().load_checkpoint(tmp_path / "plain.ckpt")
    with pytest.raises(ConfigError, match=f"ckpt_path '{tmp_path}' is a directory but not"):
        quiet_trainer(plugins=[EmbarkCheckpointIO()]).validate(
            _model(spec), loader, ckpt_path=tmp_path
        )
