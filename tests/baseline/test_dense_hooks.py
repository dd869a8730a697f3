"""The dense part's DDP hooks on gloo: each wire format averages right, and is labelled."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from lightning_embark.accounting import CommCounter, counting_collectives
from lightning_embark.baseline import DENSE_COMPRESSIONS, check_dense_compression, dense_hook
from lightning_embark.errors import ConfigError
from lightning_embark.testing._ranks import run_gloo_ranks

#: Unit roundoff of each wire format (half the gap between 1 and the next number).
UNIT = {"fp32": 2.0**-24, "bf16": 2.0**-8, "fp16": 2.0**-11}


def test_names_are_checked() -> None:
    assert DENSE_COMPRESSIONS == ("fp32", "bf16", "fp16")
    assert {dense_hook(c).__name__ for c in DENSE_COMPRESSIONS} == {
        "dense_fp32_hook",
        "dense_bf16_hook",
        "dense_fp16_hook",
    }
    with pytest.raises(ConfigError, match=r"here dense_compression='fp8' is unknown"):
        check_dense_compression("fp8", where="here")


def _local_grads(rank: int) -> tuple[torch.nn.Linear, torch.Tensor]:
    """The same Linear on every rank, fed rank-specific inputs."""
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 32)
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(rank)) * (rank + 1)
    return model, x


def check_hooks(rank: int, world: int) -> None:
    grads = []
    for r in range(world):  # every rank's local gradient, for the exact mean
        model, x = _local_grads(r)
        model(x).square().sum().backward()
        grads.append(model.weight.grad.clone())
    mean = sum(grads) / world
    magnitude = sum(g.abs() for g in grads) / world
    for compression in DENSE_COMPRESSIONS:
        model, x = _local_grads(rank)
        ddp = DistributedDataParallel(model, gradient_as_bucket_view=True)
        ddp.register_comm_hook(None, dense_hook(compression))
        counter = CommCounter(rank=rank, ranks_per_host=1, keep_calls=True)
        with counting_collectives(counter):
            ddp(x).square().sum().backward()
        # Cast of g_r / n, the sum of n of them rounded once more: each cast errs by u
        # relative to its term, the sum by u relative to the result (|mean| <= the mean
        # of |g_r|), so |result - mean| <= 2.01 u mean|g_r|; fp16's subnormals (below
        # 2^-14) add an absolute 2^-25 per cast.
        bound = 2.01 * UNIT[compression] * magnitude + world * 2.0**-25
        error = (model.weight.grad - mean).abs()
        assert (error <= bound).all(), (compression, float((error - bound).max()))
        assert model.weight.grad.dtype == torch.float32
        wire = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
        assert [(c.name, c.dtype, c.traffic) for c in counter.calls] == [
            ("all_reduce", wire[compression], "dense")
        ], counter.calls
    # torch's own bf16 hook is refused by name on a build without CUDA and NCCL, though
    # gloo reduces bf16 (above): why the baseline registers it under another name.
    if torch.version.cuda is None and torch.version.hip is None:
        model, _ = _local_grads(rank)
        with pytest.raises(TypeError, match="BF16 all reduce communication hook required CUDA"):
            DistributedDataParallel(model).register_comm_hook(
                None, default_hooks.bf16_compress_hook
            )
    dist.barrier()


@pytest.mark.multiprocess
def test_every_wire_format_averages_on_gloo_and_is_counted_as_dense() -> None:
    """On 2 gloo CPU ranks each hook gives the ranks' mean gradient within its wire
    format's rounding (bound in :func:`check_hooks`), as one ``all_reduce`` in that dtype
    under the ``dense`` traffic label."""
    run_gloo_ranks(check_hooks, 2)
