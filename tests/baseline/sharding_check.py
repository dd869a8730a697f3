"""Every sharding type on gloo against an unsharded EmbeddingBagCollection (run per rank).

Launched by ``test_sharders.py`` under ``torchrun``; ``--ranks-per-host`` emulates
hosts inside one torchrun (the baseline then sets ``LOCAL_WORLD_SIZE`` to match).
One collection holds one table per sharding type, each
forced with planner constraints; for each sparse optimizer the script shards it with
the baseline's sharders and DMP, copies the reference weights in, and records per
table: the forward difference, and the weight difference after one backward with the
fused optimizer (data-parallel tables: the plain optimizer ``configure_optimizers``
would build). With ``--qcomms fp16`` it records the forward difference under FP16
comms. Each rank writes ``<out>/rank<k>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._shard.sharded_tensor import ShardedTensor
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from torchrec.distributed.planner.types import ParameterConstraints

from lightning_embark.baseline._dmp import (
    apply_sparse_optimizer,
    shard_module,
    sync_local_world_size,
)
from lightning_embark.baseline._sharders import make_sharders
from lightning_embark.baseline._torchrec_planning import (
    plan_table_layout,
    plan_with_torchrec,
    to_torchrec_topology,
)
from lightning_embark.models._optimizers import SparseOptimizerSpec
from lightning_embark.topology import topology_preset

TYPES = ["row_wise", "table_row_wise", "grid_shard", "table_wise", "column_wise", "data_parallel"]
BATCH = 16
DIM = 16


def _configs() -> list[EmbeddingBagConfig]:
    return [
        EmbeddingBagConfig(
            name=f"t{i}", embedding_dim=DIM, num_embeddings=100 + 7 * i, feature_names=[f"f{i}"]
        )
        for i in range(len(TYPES))
    ]


class _Holder(nn.Module):
    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.ebc = EmbeddingBagCollection(tables=_configs(), device=device)

    def forward(self, kjt: KeyedJaggedTensor):
        return self.ebc(kjt)


def _kjt(seed: int) -> KeyedJaggedTensor:
    gen = torch.Generator().manual_seed(seed)
    lengths, values = [], []
    for config in _configs():
        table_lengths = torch.randint(0, 5, (BATCH,), generator=gen)
        lengths.append(table_lengths)
        values.append(
            torch.randint(0, config.num_embeddings, (int(table_lengths.sum()),), generator=gen)
        )
    return KeyedJaggedTensor.from_lengths_sync(
        keys=[c.feature_names[0] for c in _configs()],
        values=torch.cat(values),
        lengths=torch.cat(lengths),
    )


def _weights(seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {c.feature_names[0]: torch.randn(BATCH, DIM, generator=gen) for c in _configs()}


def _loss(pooled: dict[str, torch.Tensor], weights: dict[str, torch.Tensor]) -> torch.Tensor:
    return sum((pooled[f] * weights[f]).sum() for f in weights)


def _local_views(sharded: nn.Module) -> dict[str, list[tuple[torch.Tensor, list[int], list[int]]]]:
    """table -> [(local tensor, row/col offsets, sizes)] as held by this rank."""
    views = {}
    for key, value in sharded.state_dict().items():
        table = key.split(".")[-2]
        if isinstance(value, ShardedTensor):
            views[table] = [
                (s.tensor, s.metadata.shard_offsets, s.metadata.shard_sizes)
                for s in value.local_shards()
            ]
        else:
            views[table] = [(value, [0, 0], list(value.shape))]
    return views


def _diff_per_table(sharded: nn.Module, reference: EmbeddingBagCollection) -> dict[str, float]:
    diffs = {}
    for table, views in _local_views(sharded).items():
        full = reference.embedding_bags[table].weight.detach()
        worst = 0.0
        for tensor, (r, c), (nr, nc) in views:
            worst = max(worst, (tensor.detach() - full[r : r + nr, c : c + nc]).abs().max().item())
        diffs[table] = worst
    return diffs


def _shard(kind: str, qcomms: str | None, ranks_per_host: int, world: int) -> nn.Module:
    holder = _Holder(torch.device("meta"))
    sparse = SparseOptimizerSpec(kind=kind, lr=0.1, eps=1e-8)
    apply_sparse_optimizer([holder.ebc], sparse)
    sharders = make_sharders(
        device=torch.device("cpu"), fused_params=sparse.fused_params(), qcomms=qcomms
    )
    constraints = {
        f"t{i}": ParameterConstraints(sharding_types=[t], min_partition=8)
        for i, t in enumerate(TYPES)
    }
    topology = topology_preset(
        "emulated", num_hosts=world // ranks_per_host, ranks_per_host=ranks_per_host
    )
    plan = plan_with_torchrec(
        holder,
        sharders,
        topology=to_torchrec_topology(topology, compute_device="cpu"),
        constraints=constraints,
        pg=dist.GroupMember.WORLD,
    )
    sync_local_world_size(ranks_per_host)
    dmp = shard_module(
        holder, plan=plan, sharders=sharders, device=torch.device("cpu"), pg=dist.GroupMember.WORLD
    )
    dmp.layout = plan_table_layout(plan)
    return dmp


def _blockwise_diff(
    sharded: nn.Module,
    before: dict[str, torch.Tensor],
    grads: dict[str, torch.Tensor],
    *,
    lr: float,
    eps: float,
) -> dict[str, float]:
    """Difference to a first row-wise Adagrad step taken per local shard.

    The fused TBE keeps one row-wise statistic per row *of each shard*, so a table split
    by columns (column-wise, grid) averages the squared gradient over the shard's
    columns only. From a zero state the first step is ``w - lr * g / (sqrt(mean(g^2)) + eps)``.
    """
    diffs = {}
    for table, views in _local_views(sharded).items():
        key = f"embedding_bags.{table}.weight"
        worst = 0.0
        for tensor, (r, c), (nr, nc) in views:
            g = grads[key][r : r + nr, c : c + nc]
            expected = before[key][r : r + nr, c : c + nc] - lr * g / (
                g.pow(2).mean(1, keepdim=True).sqrt() + eps
            )
            worst = max(worst, (tensor.detach() - expected).abs().max().item())
        diffs[table] = worst
    return diffs


def _copy_into(sharded: nn.Module, reference: EmbeddingBagCollection) -> None:
    with torch.no_grad():
        for table, views in _local_views(sharded).items():
            full = reference.embedding_bags[table].weight
            for tensor, (r, c), (nr, nc) in views:
                tensor.copy_(full[r : r + nr, c : c + nc])


def check(kind: str, qcomms: str | None, ranks_per_host: int) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    reference = EmbeddingBagCollection(tables=_configs(), device=torch.device("cpu"))
    dmp = _shard(kind, qcomms, ranks_per_host, world)
    sharded_ebc = dmp.module.ebc
    _copy_into(sharded_ebc, reference)
    local = _kjt(100 + rank)
    out = dmp(local)
    out = out.wait() if hasattr(out, "wait") else out
    expected = reference(local).to_dict()
    got = out.to_dict()
    result = {
        "layout": dmp.layout,
        "forward": {f: (got[f] - expected[f]).abs().max().item() for f in expected},
        "forward_scale": max(expected[f].abs().max().item() for f in expected),
        "forward_close": {
            f: torch.allclose(got[f], expected[f], rtol=1e-5, atol=1e-6) for f in expected
        },
    }
    if qcomms is not None:
        return result
    # One step: fused tables updated in backward, data-parallel tables by a plain optimizer.
    _loss(got, _weights(200 + rank)).backward()
    plain = [
        p
        for p in sharded_ebc.parameters()
        if p.requires_grad and not hasattr(p, "_in_backward_optimizers")
    ]
    sparse = SparseOptimizerSpec(kind=kind, lr=0.1, eps=1e-8)
    if plain:
        sparse.build(plain).step()
    # Reference: torchrec divides the all-to-all gradients by the world size
    # (comm_ops.GRADIENT_DIVISION) as DDP does for data-parallel tables: a mean loss.
    ref_loss = sum(
        _loss(reference(_kjt(100 + r)).to_dict(), _weights(200 + r)) for r in range(world)
    )
    (ref_loss / world).backward()
    grads = {name: p.grad.clone() for name, p in reference.named_parameters()}
    before = {name: p.detach().clone() for name, p in reference.named_parameters()}
    sparse.build(reference.parameters()).step()
    result["after_step"] = _diff_per_table(sharded_ebc, reference)
    if kind == "rowwise_adagrad":
        result["after_step_blockwise"] = _blockwise_diff(
            sharded_ebc, before, grads, lr=0.1, eps=1e-8
        )
    result["step_scale"] = max(p.abs().max().item() for p in reference.parameters())
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--kinds", default="rowwise_adagrad")
    parser.add_argument("--qcomms", default="")
    parser.add_argument(
        "--ranks-per-host", type=int, default=0, help="emulate hosts (default: LOCAL_WORLD_SIZE)"
    )
    args = parser.parse_args()
    dist.init_process_group("gloo")
    ranks_per_host = args.ranks_per_host or int(os.environ["LOCAL_WORLD_SIZE"])
    results = {kind: check(kind, None, ranks_per_host) for kind in args.kinds.split(",")}
    if args.qcomms:
        results[f"qcomms_{args.qcomms}"] = check("rowwise_adagrad", args.qcomms, ranks_per_host)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{dist.get_rank()}.json").write_text(json.dumps(results, indent=1))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
