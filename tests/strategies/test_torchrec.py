"""``strategy="torchrec"`` / ``"torchrec-fp16"`` under Lightning: registration, guards,
training."""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.strategies import StrategyRegistry
from torch.utils.data import DataLoader

from lightning_embark.baseline._dmp import as_shardable, check_qcomms_device
from lightning_embark.errors import ConfigError
from lightning_embark.models import DLRMModule
from lightning_embark.registry import STRATEGIES, register_strategies
from lightning_embark.strategies import TorchrecStrategy
from lightning_embark.testing import quiet_trainer


def test_register_strategies_is_idempotent() -> None:
    register_strategies()
    register_strategies()
    assert set(STRATEGIES) <= set(StrategyRegistry)
    assert StrategyRegistry["torchrec-fp16"]["init_params"] == {"qcomms": "fp16"}
    strategy = StrategyRegistry.get("torchrec-fp16")
    assert isinstance(strategy, TorchrecStrategy) and strategy.qcomms == "fp16"
    assert StrategyRegistry.get("torchrec").qcomms is None


def test_constructor_validates_arguments() -> None:
    with pytest.raises(ConfigError, match="qcomms='fp64'"):
        TorchrecStrategy(qcomms="fp64")
    with pytest.raises(ConfigError, match="batch_size"):
        TorchrecStrategy(batch_size=0)
    with pytest.raises(ConfigError, match="topology"):
        TorchrecStrategy(topology=3)  # type: ignore[arg-type]
    assert "no plan yet" in TorchrecStrategy().plan_summary()


def test_trainer_options_fused_optimizers_cannot_honour() -> None:
    TorchrecStrategy.check_trainer_options(
        precision="32-true", gradient_clip_val=None, accumulate_grad_batches=1
    )
    with pytest.raises(ConfigError, match=r"gradient_clip_val=1\.0"):
        TorchrecStrategy.check_trainer_options(
            precision="32-true", gradient_clip_val=1.0, accumulate_grad_batches=1
        )
    with pytest.raises(ConfigError, match="accumulate_grad_batches=4"):
        TorchrecStrategy.check_trainer_options(
            precision="32-true", gradient_clip_val=None, accumulate_grad_batches=4
        )
    with pytest.raises(ConfigError, match="bf16-mixed"):
        TorchrecStrategy.check_trainer_options(
            precision="bf16-mixed", gradient_clip_val=None, accumulate_grad_batches=1
        )
    with pytest.raises(ConfigError, match="int8"):
        check_qcomms_device("int8", torch.device("cpu"))
    check_qcomms_device("fp16", torch.device("cpu"))


def test_module_without_embeddings_is_refused() -> None:
    with pytest.raises(ConfigError, match="embedding_modules"):
        as_shardable(LightningModule())


def _trainer(**kwargs) -> Trainer:
    return quiet_trainer(**({"strategy": "torchrec", "max_steps": 3} | kwargs))


def test_single_rank_fit_and_refusals(single_rank_world, synthetic) -> None:
    spec = synthetic.tiny_spec()
    batches = synthetic.synthetic_batches(spec, num_batches=3, batch_size=32)
    loader = DataLoader(synthetic.BatchDataset(batches), batch_size=None)

    def model() -> DLRMModule:
        return DLRMModule(spec, dense_arch_layer_sizes=[16], over_arch_layer_sizes=[8, 1])

    fitted = model()
    trainer = _trainer()
    trainer.fit(fitted, loader)
    assert trainer.global_step == 3
    assert "t_f0" in trainer.strategy.plan_summary()
    # The fitting Trainer keeps the sharded model for validate/predict.
    assert {"val_loss", "val_auc"} <= set(trainer.validate(fitted, loader, verbose=False)[0])
    probabilities = torch.cat(trainer.predict(fitted, loader))
    assert probabilities.shape == (96,) and ((probabilities >= 0) & (probabilities <= 1)).all()
    with pytest.raises(ConfigError, match="enable_checkpointing=False"):
        trainer.save_checkpoint("never-written.ckpt")
    with pytest.raises(ConfigError, match="already sharded"):
        _trainer().validate(fitted, loader)
    with pytest.raises(ConfigError, match="accumulate_grad_batches=2"):
        _trainer(accumulate_grad_batches=2).fit(model(), loader)
    with pytest.raises(ConfigError, match=r"gradient_clip_val=0\.5"):
        _trainer(gradient_clip_val=0.5).fit(model(), loader)
    with pytest.raises(ConfigError, match="enable_checkpointing=False"):
        _trainer(enable_checkpointing=True).fit(model(), loader)


def _assert_trained(ranks: list[dict], *, hosts: int, per_host: int, qcomms: bool) -> list[str]:
    """Check every rank's record; returns the sharding types of the plan."""
    for rank, result in enumerate(ranks):
        losses = result["losses"]
        assert len(losses) == 16
        first, last = sum(losses[:4]) / 4, sum(losses[-4:]) / 4
        assert last < first - 0.1, (rank, losses)
        assert result["world_size"] == hosts * per_host
        assert result["topology"] == {"num_hosts": hosts, "ranks_per_host": per_host}
        assert result["embeddings_sharded"]
        # Tables torchrec shards run their optimizer fused in backward and stay out of the
        # Lightning optimizer; data-parallel tables get the same sparse optimizer from
        # configure_optimizers, chained with the dense one.
        kinds = {table.rsplit(".", 1)[-1]: kind for table, (kind, _) in result["layout"].items()}
        table_of = lambda name: name.rsplit(".", 2)[-2]  # noqa: E731  (...embedding_bags.<table>.weight)
        fused = {table_of(n) for n in result["fused_names"]}
        assert fused == {t for t, kind in kinds.items() if kind != "data_parallel"}, (kinds, fused)
        optimized_tables = {
            table_of(n) for n in result["optimized_names"] if ".embedding_bags." in n
        }
        assert optimized_tables == set(kinds) - fused
        assert result["optimizer"] == ("ChainedOptimizer" if optimized_tables else "Adagrad")
        assert result["qcomms_registry"] is qcomms
        if fused:  # the fused TBEs run the module's sparse optimizer with its learning rate
            assert result["fused_optimizer_lr"] == [pytest.approx(0.05)]
        assert {"val_loss", "val_auc"} <= set(result["validate_metrics"])
        assert 0.0 <= result["validate_metrics"]["val_auc"] <= 1.0
        for table, (_kind, shard_ranks) in result["layout"].items():
            assert shard_ranks and all(0 <= r < hosts * per_host for r in shard_ranks), table
    # Every rank sees the same plan and the same (all-reduced) validation metrics.
    assert len({r["plan_summary"] for r in ranks}) == 1
    assert len({tuple(sorted(r["validate_metrics"].items())) for r in ranks}) == 1
    return sorted({kind for kind, _ in ranks[0]["layout"].values()})


@pytest.mark.multiprocess
def test_lightning_launcher_two_ranks(run_lightning, tmp_path) -> None:
    """Lightning starts the second rank itself (re-running the script)."""
    ranks = run_lightning(
        "lightning_run.py", ["--strategy", "torchrec", "--devices", "2"], world=2, out=tmp_path
    )
    _assert_trained(ranks, hosts=1, per_host=2, qcomms=False)


@pytest.mark.multiprocess
def test_torchrun_two_nodes_fp16(run_torchrun, tmp_path) -> None:
    """Two torchrun agents (emulated nodes) x 1 rank, FP16 qcomms, DCNv2 interaction."""
    args = [
        "--strategy",
        "torchrec-fp16",
        "--devices",
        "1",
        "--num-nodes",
        "2",
        "--interaction",
        "dcn",
    ]
    ranks = run_torchrun("lightning_run.py", args, nodes=2, per_node=1, out=tmp_path)
    _assert_trained(ranks, hosts=2, per_host=1, qcomms=True)
