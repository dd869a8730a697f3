"""``strategy="torchrec"`` / ``"torchrec-fp16"`` / ``"torchrec-twrw"`` under Lightning:
registration, guards, training, the dense gradients' wire format."""

from __future__ import annotations

import os

import pytest
import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.strategies import StrategyRegistry
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader
from torchrec.distributed.planner.types import ParameterConstraints
from torchrec.distributed.types import ShardingPlan

from lightning_embark.accounting import CommAccountingCallback
from lightning_embark.baseline import hooked_ddp_modules, plan_table_layout
from lightning_embark.baseline._dense_hooks import (
    dense_bf16_hook,
    dense_fp32_hook,
    dp_tables_hook,
)
from lightning_embark.baseline._dmp import as_shardable, check_qcomms_device
from lightning_embark.errors import ConfigError
from lightning_embark.models import EMBEDDING_PATH, DLRMModule
from lightning_embark.registry import STRATEGIES, register_strategies
from lightning_embark.sharding import hierarchical_allreduce_hook
from lightning_embark.strategies import TorchrecStrategy
from lightning_embark.testing import quiet_trainer
from lightning_embark.testing._ranks import run_gloo_ranks


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


def test_dense_compression_and_sharding_types_are_checked() -> None:
    """Both options fail at construction, naming the value and the choices."""
    assert TorchrecStrategy().dense_compression == "fp32"
    assert TorchrecStrategy(dense_compression="bf16").dense_exchange == "flat"
    with pytest.raises(ConfigError, match=r"dense_exchange='ring'"):
        TorchrecStrategy(dense_exchange="ring")
    with pytest.raises(ConfigError, match=r"dense_compression='int8' is unknown.*'bf16'"):
        TorchrecStrategy(dense_compression="int8")
    with pytest.raises(ConfigError, match=r"sharding_types=\['twrw'\].*'table_row_wise'"):
        TorchrecStrategy(sharding_types=["twrw"])
    with pytest.raises(ConfigError, match="both a plan and sharding_types"):
        TorchrecStrategy(sharding_types=["table_row_wise"], plan=ShardingPlan(plan={}))
    with pytest.raises(ConfigError, match=r"\{'t_f0': \['table_wise'\]\} outside"):
        TorchrecStrategy(
            sharding_types=["table_row_wise"],
            constraints={"t_f0": ParameterConstraints(sharding_types=["table_wise"])},
        )
    register_strategies()
    twrw = StrategyRegistry.get("torchrec-twrw")
    assert isinstance(twrw, TorchrecStrategy) and twrw.sharding_types == ("table_row_wise",)
    assert twrw.qcomms is None and twrw.dense_compression == "fp32"


class _DenseBytes(Callback):
    """Losses, and this rank's ``dense``-labelled bytes of every step."""

    def __init__(self, accounting: CommAccountingCallback) -> None:
        self.accounting = accounting
        self.losses: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.losses.append(float(outputs["loss"]))

    def dense_bytes(self) -> list[int]:
        traffic = [step.comm.by_traffic.get("dense") for step in self.accounting.steps]
        return [0 if t is None else t.intra_host_bytes + t.inter_host_bytes for t in traffic]


def _fit_torchrec(synthetic, rank: int, steps: int, strategy) -> tuple[Trainer, _DenseBytes]:
    spec = synthetic.tiny_spec()
    batches = synthetic.synthetic_batches(spec, num_batches=steps, batch_size=64, seed=rank)
    torch.manual_seed(0)
    model = DLRMModule(
        spec,
        dense_arch_layer_sizes=[32, 16],
        over_arch_layer_sizes=[32, 1],
        dense_lr=0.05,
        sparse_lr=0.05,
    )
    accounting = CommAccountingCallback(log=False, ranks_per_host=1)
    record = _DenseBytes(accounting)
    trainer = quiet_trainer(
        strategy=strategy,
        devices=2,
        max_steps=steps,
        use_distributed_sampler=False,
        callbacks=[accounting, record],
    )
    trainer.fit(model, DataLoader(synthetic.BatchDataset(batches), batch_size=None))
    return trainer, record


def _dense_ddp(trainer: Trainer) -> DistributedDataParallel:
    ddp = trainer.strategy.model._dmp_wrapped_module
    assert isinstance(ddp, DistributedDataParallel)
    return ddp


def check_twrw_and_dense_exchange(rank: int, world: int, synthetic) -> None:
    os.environ["EMBARK_RANKS_PER_HOST"] = "1"  # 2 emulated hosts x 1 rank
    register_strategies()
    twrw, fp32 = _fit_torchrec(synthetic, rank, 16, "torchrec-twrw")
    layout = plan_table_layout(twrw.strategy.plan)
    assert len(layout) == 4 and {kind for kind, _ in layout.values()} == {"table_row_wise"}
    losses = fp32.losses
    assert sum(losses[-4:]) / 4 < sum(losses[:4]) / 4 - 0.1, losses
    dense = _dense_ddp(twrw)
    assert [hook for hook, _ in dense._comm_hooks] == [dense_fp32_hook]
    # DDP's averaging all-reduce of the dense parameters on a 2-rank ring sends
    # 2 (n - 1) / n = 1 buffer of fp32 per step to the other rank.
    params = sum(p.numel() for p in dense.parameters() if not hasattr(p, "_ddp_ignored"))
    assert set(fp32.dense_bytes()) == {4 * params}, (fp32.dense_bytes(), params)

    bf16_strategy = TorchrecStrategy(sharding_types=["table_row_wise"], dense_compression="bf16")
    compressed, bf16 = _fit_torchrec(synthetic, rank, 2, bf16_strategy)
    assert [hook for hook, _ in _dense_ddp(compressed)._comm_hooks] == [dense_bf16_hook]
    assert compressed.strategy.dense_compression == "bf16"
    assert set(bf16.dense_bytes()) == {2 * params}, bf16.dense_bytes()

    # The host-aware all-reduce (embark's) on torchrec's dense DDP: on 2 hosts of 1 rank it
    # is one all-reduce of grad / 2 across hosts, DDP's own hook's arithmetic exactly (each
    # rank's gradient halved, then summed), so the losses are the fp32 run's bit for bit.
    hier_strategy = TorchrecStrategy(
        sharding_types=["table_row_wise"], dense_exchange="hierarchical"
    )
    hier, hier_bytes = _fit_torchrec(synthetic, rank, 2, hier_strategy)
    assert [hook for hook, _ in _dense_ddp(hier)._comm_hooks] == [hierarchical_allreduce_hook]
    assert hier.strategy.dense_exchange == "hierarchical"
    assert set(hier_bytes.dense_bytes()) == {4 * params}
    assert hier_bytes.losses == fp32.losses[:2]
    hier.strategy.teardown()

    # A data-parallel table's gradient all-reduce is embedding traffic, as embark's DP
    # clusters': it stays out of the dense bytes.
    dp_strategy = TorchrecStrategy(
        constraints={"t_f0": ParameterConstraints(sharding_types=["data_parallel"])}
    )
    with_dp, dp = _fit_torchrec(synthetic, rank, 2, dp_strategy)
    assert plan_table_layout(with_dp.strategy.plan)[f"{EMBEDDING_PATH}.t_f0"][0] == "data_parallel"
    hooks = {hook for _, hook in hooked_ddp_modules(with_dp.strategy.model, "fp32")}
    assert hooks == set(), "every DDP got its hook at the wrap"
    lookups = with_dp.lightning_module.embedding_modules()[EMBEDDING_PATH]._lookups
    dp_hooks = [
        h for m in lookups if isinstance(m, DistributedDataParallel) for h, _ in m._comm_hooks
    ]
    assert dp_hooks == [dp_tables_hook]
    assert set(dp.dense_bytes()) == {4 * params}


@pytest.mark.multiprocess
def test_twrw_trains_and_dense_bytes_follow_the_wire_format(synthetic) -> None:
    """``torchrec-twrw`` on 2 gloo ranks as 2 hosts x 1 rank: torchrec's plan puts every
    table table-row-wise, and it learns; the dense part's DDP carries the hook of its
    wire format, and the counter's ``dense`` bytes per step are exactly
    ``4 x`` (fp32) and ``2 x`` (bf16) the dense parameters. The counter counts payload
    only (no message headers) and the ring's ``2 (n - 1) / n`` is 1 on 2 ranks, so there is
    no rounding: bf16's bytes are half of fp32's to the byte."""
    run_gloo_ranks(check_twrw_and_dense_exchange, 2, synthetic)
