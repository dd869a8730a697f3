"""The engine's device, backend and store per rank, chosen apart from the launch: what a
GPU run would choose, checked on a CPU machine."""

from __future__ import annotations

import pytest
import torch

from lightning_embark.engine import EnginePlacement, engine_placement
from lightning_embark.errors import ConfigError
from lightning_embark.strategies import EmbarkStrategy


def test_cpu_ranks_run_over_gloo_with_the_kernel_asked_for() -> None:
    for store in ("auto", "fbgemm", "torch"):
        placement = engine_placement(torch.device("cpu"), store=store)
        assert placement == EnginePlacement(
            device=torch.device("cpu"), backend="gloo", store=store
        )


def test_gpu_ranks_run_over_nccl_on_their_own_device_with_the_torch_store() -> None:
    placement = engine_placement(torch.device("cuda", 3))
    assert placement == EnginePlacement(
        device=torch.device("cuda", 3), backend="nccl", store="torch"
    )
    assert engine_placement(torch.device("cuda", 0), store="torch").store == "torch"
    with pytest.raises(ConfigError, match=r"fbgemm's CPU .* use store='auto' or 'torch'"):
        engine_placement(torch.device("cuda", 0), store="fbgemm")


@pytest.mark.parametrize(
    ("device", "backend", "match"),
    [
        ("mps", None, r"not on mps; use Trainer\(accelerator='cpu'\) or accelerator='gpu'"),
        ("cuda:0", "gloo", r"process_group_backend='gloo' cannot run .* on cuda .*'nccl'"),
        ("cpu", "nccl", r"process_group_backend='nccl' cannot run .* on cpu .*'gloo'"),
    ],
)
def test_a_device_or_backend_the_engine_cannot_run_on_is_named(
    device: str, backend: str | None, match: str
) -> None:
    with pytest.raises(ConfigError, match=match):
        engine_placement(torch.device(device), process_group_backend=backend)


def test_a_placement_checks_its_backend() -> None:
    with pytest.raises(ConfigError, match="needs the nccl backend"):
        EnginePlacement(device=torch.device("cuda", 0), backend="gloo", store="torch")


def test_the_strategy_places_the_engine_from_the_trainers_device() -> None:
    """What ``setup`` shards with, for the devices Lightning would give the strategy (one
    per local rank); no GPU is needed to ask."""
    strategy = EmbarkStrategy()
    strategy.parallel_devices = [torch.device("cuda", 0), torch.device("cuda", 1)]
    assert strategy.root_device == torch.device("cuda", 0)
    placement = strategy.placement()
    assert (placement.device, placement.backend, placement.store) == (
        torch.device("cuda", 0),
        "nccl",
        "torch",
    )
    cpu = EmbarkStrategy()
    cpu.parallel_devices = [torch.device("cpu")]
    assert cpu.placement().backend == "gloo"
    gloo_on_gpu = EmbarkStrategy(process_group_backend="gloo")
    gloo_on_gpu.parallel_devices = [torch.device("cuda", 0)]
    with pytest.raises(ConfigError, match="process_group_backend='gloo'"):
        gloo_on_gpu.placement()
