"""DLRMModule with towers: torchrec's tower collection inside, sized interactions, the
dense optimizer over the tower modules, training alone and under strategy="embark"."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader
from torchrec.modules.embedding_tower import EmbeddingTowerCollection

from lightning_embark.errors import ConfigError
from lightning_embark.models import DLRMModule
from lightning_embark.models._tower_dlrm import tower_collection, tower_output_dim
from lightning_embark.plan import TowerModule, TowerRequest, save_towers
from lightning_embark.registry import register_strategies
from lightning_embark.strategies import EmbarkStrategy
from lightning_embark.testing import quiet_trainer
from lightning_embark.testing._ranks import run_gloo_ranks

SMALL = dict(
    dense_arch_layer_sizes=[16], over_arch_layer_sizes=[16, 1], dense_lr=0.1, sparse_lr=0.1
)


def _towers(path: Path, module: str = "projection") -> str:
    width = {"output_ratio": 2.0} if module != "identity" else {}
    save_towers(
        [
            TowerRequest(name="a", tables=("f0", "f1"), module=module, **width),
            TowerRequest(name="b", tables=("f2",), module=module, **width),
        ],
        path,
    )
    return str(path)


@pytest.mark.parametrize(
    ("interaction", "module"),
    [("dot", "projection"), ("dcn", "dcn"), ("dot", "identity"), ("dot", "dot"), ("dcn", "dot")],
)
def test_a_towered_dlrm_trains_alone(
    synthetic: Any, tmp_path: Path, interaction: str, module: str
) -> None:
    spec = synthetic.tiny_spec(rows=200)
    model = DLRMModule(
        spec,
        towers=_towers(tmp_path / "t.json", module),
        interaction=interaction,
        **SMALL,
        dcn_num_layers=1,
        dcn_low_rank_dim=4,
    )
    assert set(model.embedding_modules()) == {"model.flat", "model.towers"}
    assert model.embeddings_on_meta()
    model.materialize_embeddings()
    assert not model.embeddings_on_meta()
    batches = synthetic.synthetic_batches(spec, num_batches=2, batch_size=8)
    assert model(batches[0].dense_features, batches[0].sparse_features).shape == (8,)
    optimizer = model.configure_optimizers()
    dense = {id(p) for p in optimizer.optimizers[0].param_groups[0]["params"]}
    tower_params = list(model.model.towers.towers[0].interaction.parameters())
    assert all(id(p) in dense for p in tower_params), "tower modules are dense parameters"
    tables = {id(p) for t in model.model.towers.towers for p in t.embedding.parameters()}
    assert not tables & dense, "tower tables take the sparse optimizer"


def test_tower_widths_are_whole_vectors() -> None:
    assert (
        tower_output_dim(
            TowerRequest(name="t", tables=("a",), module="dcn", output_ratio=4.0), 5, 16
        )
        == 16
    )
    assert tower_output_dim(TowerRequest(name="t", tables=("a",)), 3, 16) == 48
    with pytest.raises(ConfigError, match="multiple of the embedding dim 16"):
        tower_output_dim(
            TowerRequest(name="t", tables=("a",), module="projection", output_dim=20), 2, 16
        )
    # A dot tower: whole vectors plus its n (n - 1) / 2 pair terms, from a ratio or given.
    dot = TowerRequest(name="t", tables=("a",), module="dot", output_ratio=4.0)
    assert tower_output_dim(dot, 5, 16) == 16 + 10
    assert tower_output_dim(dot, 8, 16) == 32 + 28
    given = TowerRequest(name="t", tables=("a",), module="dot", output_dim=16 + 3)
    assert tower_output_dim(given, 3, 16) == 19
    with pytest.raises(ConfigError, match="plus its 3 pair terms"):
        tower_output_dim(dataclasses.replace(given, output_dim=3), 3, 16)
    custom = [TowerRequest(name="t", tables=(), module=TowerModule.CUSTOM, output_dim=16)]
    with pytest.raises(ConfigError, match="'custom'; a DLRMModule builds"):
        tower_collection([], custom, dim=16, device=torch.device("cpu"))


def _fit(rank: int, world: int, synthetic: Any, towers: str) -> None:
    register_strategies()
    spec = synthetic.tiny_spec(rows=400)
    batches = synthetic.synthetic_batches(spec, num_batches=24, batch_size=64, seed=rank)
    torch.manual_seed(0)
    model = DLRMModule(spec, towers=towers, **SMALL)
    losses: list[float] = []

    class Record(__import__("lightning").pytorch.Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
            losses.append(float(outputs["loss"]))

    strategy = EmbarkStrategy(topology="emulated")
    trainer = quiet_trainer(
        strategy=strategy,
        devices=world,
        max_steps=24,
        use_distributed_sampler=False,
        callbacks=[Record()],
    )
    trainer.fit(model, DataLoader(synthetic.BatchDataset(batches), batch_size=None))
    plan = strategy.plan
    assert plan is not None and {t.module for t in plan.towers} == {TowerModule.CUSTOM}
    assert sorted(len(t.tables) for t in plan.towers) == [1, 2]
    assert isinstance(model.model.towers, torch.nn.Module) and not isinstance(
        model.model.towers, EmbeddingTowerCollection
    )
    assert sum(losses[-6:]) / 6 < sum(losses[:6]) / 6 - 0.05, losses
    # Every rank of a tower's host holds the same tower module after training.
    for tower in plan.towers:
        module = model.model.towers.towers[tower.name]
        flat = torch.cat([p.detach().reshape(-1) for p in module.parameters()])
        gathered = [torch.zeros_like(flat) for _ in range(world)]
        dist.all_gather(gathered, flat)
        local = plan.ranks_per_host
        peers = gathered[tower.host * local : (tower.host + 1) * local]
        assert all(torch.equal(peers[0], g) for g in peers)


@pytest.mark.multiprocess
@pytest.mark.parametrize("module", ["projection", "dot"])
def test_a_towered_dlrm_learns_under_embark_on_two_hosts(
    synthetic: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, module: str
) -> None:
    monkeypatch.setenv("EMBARK_RANKS_PER_HOST", "2")
    run_gloo_ranks(_fit, 4, synthetic, _towers(tmp_path / "towers.json", module))


def test_a_dot_towers_pair_terms_reach_the_top_mlp_as_they_are(
    synthetic: Any, tmp_path: Path
) -> None:
    """The top MLP reads the interaction's output, then each dot tower's pair terms, which
    are exactly ``<e_i, e_j>`` (``i < j``) of its tables' pooled vectors."""
    spec = synthetic.tiny_spec(rows=50)
    names = [t.name for t in spec.tables]
    path = tmp_path / "t.json"
    save_towers(
        [TowerRequest(name="a", tables=tuple(names[:3]), module="dot", output_ratio=4.0)], path
    )
    model = DLRMModule(spec, towers=str(path), **SMALL)
    model.materialize_embeddings()
    batch = synthetic.synthetic_batches(spec, num_batches=1, batch_size=6)[0]
    seen: list[torch.Tensor] = []
    model.model.over_arch.register_forward_hook(lambda m, args, out: seen.append(args[0]))
    with torch.no_grad():
        model(batch.dense_features, batch.sparse_features)
        pooled = model.model.towers.towers[0].embedding(batch.sparse_features)
        e = pooled.values().reshape(6, 3, -1)
    (top,) = seen
    # dense 16 + the pair and dense-slot terms of 2 vectors (f3, the tower's one) + 3 pairs
    assert top.shape == (6, 16 + 1 + 2 + 3)
    expected = torch.stack([(e[:, i] * e[:, j]).sum(1) for i, j in ((0, 1), (0, 2), (1, 2))], 1)
    torch.testing.assert_close(top[:, -3:], expected)


def test_a_towers_file_without_towers_is_the_flat_model(synthetic: Any, tmp_path: Path) -> None:
    """What ``embark-plan --towers auto --towers-out`` writes when flat is cheaper."""
    path = tmp_path / "none.json"
    save_towers([], path)
    model = DLRMModule(synthetic.tiny_spec(rows=50), towers=str(path), **SMALL)
    assert set(model.embedding_modules()) == {"model.sparse_arch.embedding_bag_collection"}
