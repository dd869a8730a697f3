"""The baseline's sharders: row-based types on CPU, fused optimizers, FP16 qcomms."""

from __future__ import annotations

import pytest
import torch
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.fbgemm_qcomm_codec import CommType
from torchrec.distributed.types import CommOp

from lightning_embark.baseline import TowerCollectionSharder
from lightning_embark.baseline._sharders import (
    ROW_BASED_SHARDING_TYPES,
    AllShardingTypesEBCSharder,
    make_sharders,
    qcomms_config,
)
from lightning_embark.errors import ConfigError

TYPES = ["row_wise", "table_row_wise", "grid_shard", "table_wise", "column_wise", "data_parallel"]
TOL = 1e-5


def test_cpu_gets_row_based_types_and_cuda_is_unchanged() -> None:
    sharder = AllShardingTypesEBCSharder()
    cpu = sharder.sharding_types("cpu")
    assert set(ROW_BASED_SHARDING_TYPES) <= set(cpu)
    assert set(EmbeddingBagCollectionSharder().sharding_types("cpu")) <= set(cpu)
    assert sharder.sharding_types("cuda") == EmbeddingBagCollectionSharder().sharding_types("cuda")
    # The fused TBE is what every sharded (non data-parallel) type computes with on CPU.
    assert "fused" in sharder.compute_kernels("row_wise", "cpu")


def test_qcomms_config_names() -> None:
    assert qcomms_config(None) is None and qcomms_config("fp32") is None
    config = qcomms_config("fp16")
    assert config.forward_precision == CommType.FP16 and config.backward_precision == CommType.FP16
    with pytest.raises(ConfigError, match="fp64"):
        qcomms_config("fp64")


def test_make_sharders_carries_fused_params_and_codecs() -> None:
    fused = {"learning_rate": 0.1}
    plain = make_sharders(device=torch.device("cpu"), fused_params=fused)
    assert [type(s) for s in plain] == [AllShardingTypesEBCSharder, TowerCollectionSharder]
    for sharder in plain:
        assert sharder.fused_params == fused and sharder.qcomm_codecs_registry is None
    for sharder in make_sharders(device=torch.device("cpu"), qcomms="fp16"):
        registry = sharder.qcomm_codecs_registry
        assert registry is not None
        assert {
            CommOp.POOLED_EMBEDDINGS_ALL_TO_ALL.name,
            CommOp.POOLED_EMBEDDINGS_REDUCE_SCATTER.name,
        } <= set(registry)


def _check_layout(rank_result: dict) -> None:
    for kind, result in rank_result.items():
        forced = {table.split(".")[-1]: layout[0] for table, layout in result["layout"].items()}
        assert forced == {f"t{i}": t for i, t in enumerate(TYPES)}, kind


@pytest.mark.multiprocess
@pytest.mark.parametrize(
    ("hosts", "per_host", "kinds", "qcomms"),
    [(1, 2, "rowwise_adagrad,adagrad,sgd", "fp16"), (2, 1, "rowwise_adagrad", "")],
    ids=["1host-x-2ranks", "2hosts-x-1rank"],
)
def test_every_sharding_type_matches_unsharded(
    run_torchrun, tmp_path, hosts: int, per_host: int, kinds: str, qcomms: str
) -> None:
    """Forward equals the unsharded EBC; one fused-optimizer step equals a plain one."""
    args = ["--kinds", kinds, "--ranks-per-host", str(per_host)] + (
        ["--qcomms", qcomms] if qcomms else []
    )
    # One torchrun with emulated hosts: a second torchrun agent costs ~8 s on 2 cores.
    ranks = run_torchrun(
        "sharding_check.py", args, nodes=1, per_node=hosts * per_host, out=tmp_path
    )
    for rank, result in enumerate(ranks):
        _check_layout({k: v for k, v in result.items() if not k.startswith("qcomms")})
        for kind in kinds.split(","):
            got = result[kind]
            assert all(got["forward_close"].values()), (rank, kind, got["forward"])
            after = got["after_step"]
            if kind == "rowwise_adagrad":
                # TBE keeps one row-wise statistic per row of each shard: tables split by
                # columns (column-wise, grid) match a per-shard row-wise step exactly and
                # differ from the unsharded one; the others match the unsharded step.
                assert max(got["after_step_blockwise"].values()) < TOL, (
                    rank,
                    got["after_step_blockwise"],
                )
                assert all(
                    after[f"t{i}"] < TOL
                    for i, t in enumerate(TYPES)
                    if t not in ("column_wise", "grid_shard")
                )
                assert all(
                    after[f"t{i}"] > 1e-3
                    for i, t in enumerate(TYPES)
                    if t in ("column_wise", "grid_shard")
                )
            else:
                assert max(after.values()) < TOL, (rank, kind, after)
        if qcomms:
            quantized = result[f"qcomms_{qcomms}"]
            worst = max(quantized["forward"].values())
            # FP16 comms: close to fp32 (fp16 has ~3 decimal digits) but not bit-equal.
            assert 0 < worst < 2e-3 * quantized["forward_scale"], quantized["forward"]
