"""The engine's store on CUDA ranks, as a pure function of what runs there: fbgemm's
CUDA kernels where a CUDA build of fbgemm loads, the torch store otherwise."""

from __future__ import annotations

import pytest
import torch

from lightning_embark.engine import engine_placement, placement_store
from lightning_embark.errors import ConfigError


@pytest.mark.parametrize(
    ("device", "store", "fbgemm_cuda", "expected"),
    [
        ("cuda", "auto", True, "auto"),  # make_store picks fbgemm where widths allow
        ("cuda", "auto", False, "torch"),
        ("cuda", "fbgemm", True, "fbgemm"),
        ("cuda", "torch", True, "torch"),
        ("cpu", "auto", False, "auto"),
        ("cpu", "fbgemm", False, "fbgemm"),
    ],
)
def test_the_kernel_per_device_and_availability(device, store, fbgemm_cuda, expected) -> None:
    assert placement_store(device, store, fbgemm_cuda=fbgemm_cuda) == expected


def test_fbgemm_on_a_gpu_needs_its_cuda_kernels() -> None:
    with pytest.raises(ConfigError, match=r"needs fbgemm's CUDA kernels.*CUDA build of fbgemm"):
        placement_store("cuda", "fbgemm", fbgemm_cuda=False)


def test_a_cuda_rank_with_fbgemm_gets_nccl_and_the_fbgemm_store() -> None:
    placement = engine_placement(torch.device("cuda", 1), fbgemm_cuda=True)
    assert (placement.backend, placement.store) == ("nccl", "auto")
    assert engine_placement(torch.device("cuda", 1), store="fbgemm", fbgemm_cuda=True).store == (
        "fbgemm"
    )
    assert engine_placement(torch.device("cuda", 1), fbgemm_cuda=False).store == "torch"


def test_detection_finds_no_cuda_kernels_without_a_gpu() -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: detection depends on its fbgemm build")
    assert engine_placement(torch.device("cuda", 0)).store == "torch"
