"""The fbgemm store's CUDA path, through its pure parts (no GPU here): block locations
from the plan's cache factors, the kernel's arguments, the store choice, and the
device discipline of the host path that shares its code."""

from __future__ import annotations

import pytest
import torch

from lightning_embark.engine._optimizer import OptimizerKind, SparseOptimizer
from lightning_embark.engine.stores import (
    Bags,
    FbgemmStore,
    TorchStore,
    block_locations,
    fbgemm_available,
    fbgemm_cuda_available,
    make_store,
    store_choice,
    tbe_arguments,
    tbe_cache_load_factor,
)
from lightning_embark.engine.stores._fbgemm_store import fbgemm_cuda_ops_registered
from lightning_embark.errors import ConfigError

needs_fbgemm = pytest.mark.skipif(not fbgemm_available(), reason="fbgemm CPU kernels unavailable")


def test_locations_follow_the_device_and_the_cache_factor() -> None:
    factors = [None, 1.0, 0.25]
    assert block_locations("cuda", factors) == ["DEVICE", "DEVICE", "MANAGED_CACHING"]
    assert block_locations("cpu", factors) == ["HOST"] * 3  # host memory is all there is
    with pytest.raises(ConfigError, match="'cpu' or 'cuda' devices, not 'meta'"):
        block_locations("meta", factors)


def test_one_kernel_cache_holds_the_slots_the_plan_gave_each_block() -> None:
    """fbgemm sizes one cache of ``factor * (cached rows)``: 0.5 * 100 + 0.1 * 300 = 80
    slots of the 400 cached rows, a factor of 0.2; the HBM block adds none."""
    shapes = [(100, 8), (300, 8), (1000, 8)]
    assert tbe_cache_load_factor(shapes, [0.5, 0.1, None]) == pytest.approx(0.2)
    assert tbe_cache_load_factor(shapes, [None, 1.0, None]) is None


@needs_fbgemm
def test_cuda_arguments_place_blocks_and_size_the_cache() -> None:
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import (
        CacheAlgorithm,
        EmbeddingLocation,
    )
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import ComputeDevice

    optimizer = SparseOptimizer(kind=OptimizerKind.ROWWISE_ADAGRAD, lr=0.1)
    device = torch.device("cuda", 2)
    args = tbe_arguments(
        [(100, 8), (300, 16)], optimizer, device=device, cache_load_factors=[None, 0.5]
    )
    assert args["embedding_specs"] == [
        (100, 8, EmbeddingLocation.DEVICE, ComputeDevice.CUDA),
        (300, 16, EmbeddingLocation.MANAGED_CACHING, ComputeDevice.CUDA),
    ]
    assert args["device"] == device and args["cache_load_factor"] == 0.5
    assert args["cache_algorithm"] is CacheAlgorithm.LRU
    assert args["optimizer"] is EmbOptimType.EXACT_ROWWISE_ADAGRAD and args["learning_rate"] == 0.1
    in_hbm = tbe_arguments([(100, 8)], optimizer, device=device)
    assert "cache_load_factor" not in in_hbm
    assert in_hbm["embedding_specs"][0][2] is EmbeddingLocation.DEVICE
    host = tbe_arguments(
        [(100, 8)], optimizer, device=torch.device("cpu"), cache_load_factors=[0.5]
    )
    assert host["embedding_specs"] == [(100, 8, EmbeddingLocation.HOST, ComputeDevice.CPU)]
    assert "device" not in host and "cache_load_factor" not in host
    with pytest.raises(ConfigError, match="2 cache load factors for 1 blocks"):
        tbe_arguments([(100, 8)], optimizer, device=device, cache_load_factors=[None, 0.5])


@pytest.mark.parametrize(
    ("kernel", "device", "fits", "cpu", "cuda", "expected"),
    [
        ("auto", "cpu", True, True, False, "fbgemm"),
        ("auto", "cpu", True, False, False, "torch"),
        ("auto", "cpu", False, True, False, "torch"),
        ("auto", "cuda", True, True, True, "fbgemm"),
        ("auto", "cuda", True, True, False, "torch"),
        ("auto", "cuda", False, False, True, "torch"),
        ("torch", "cuda", True, True, True, "torch"),
        ("fbgemm", "cuda", True, False, True, "fbgemm"),
        ("fbgemm", "cpu", True, False, False, "fbgemm"),  # as before: fbgemm's import error
        ("auto", "meta", True, True, True, "torch"),
    ],
)
def test_the_store_choice(kernel, device, fits, cpu, cuda, expected) -> None:
    assert (
        store_choice(kernel, device, widths_fit=fits, fbgemm_cpu=cpu, fbgemm_cuda=cuda) == expected
    )


def test_fbgemm_is_refused_where_its_kernels_do_not_run() -> None:
    choose = dict(widths_fit=True, fbgemm_cpu=True)
    with pytest.raises(ConfigError, match="CUDA build of fbgemm-gpu"):
        store_choice("fbgemm", "cuda", fbgemm_cuda=False, **choose)
    with pytest.raises(ConfigError, match=r"fbgemm.s CPU .* device is meta"):
        store_choice("fbgemm", "meta", fbgemm_cuda=True, **choose)
    with pytest.raises(ConfigError, match="multiples of 4"):
        store_choice("fbgemm", "cpu", widths_fit=False, fbgemm_cpu=True, fbgemm_cuda=False)
    with pytest.raises(ConfigError, match="store must be"):
        store_choice("cuda", "cuda", fbgemm_cuda=True, **choose)


def test_the_cpu_build_reports_no_cuda_kernels() -> None:
    """The installed fbgemm-gpu-cpu registers its caching ops for the CPU key only, and
    this machine has no GPU: the CUDA path is not taken here."""
    if not torch.cuda.is_available():
        assert not fbgemm_cuda_available("cuda:0")
    assert not fbgemm_cuda_available("cpu")
    if fbgemm_available() and not torch.cuda.is_available():
        assert not fbgemm_cuda_ops_registered()


@needs_fbgemm
def test_cache_factors_change_nothing_on_the_host() -> None:
    optimizer = SparseOptimizer(kind=OptimizerKind.ROWWISE_ADAGRAD)
    store = make_store("auto", [(10, 8), (7, 4)], optimizer, cache_load_factors=[0.5, None])
    assert isinstance(store, FbgemmStore)
    with pytest.raises(ConfigError, match="1 cache load factors for 2 blocks"):
        make_store("auto", [(10, 8), (7, 4)], optimizer, cache_load_factors=[0.5])


def test_the_torch_fallback_off_the_host_keeps_its_device() -> None:
    optimizer = SparseOptimizer(kind=OptimizerKind.ROWWISE_ADAGRAD)
    store = make_store("auto", [(3, 4)], optimizer, device="meta", cache_load_factors=[0.5])
    assert isinstance(store, TorchStore) and store.weights()[0].device.type == "meta"


@needs_fbgemm
def test_the_fbgemm_store_makes_its_tensors_on_its_own_device() -> None:
    """Under a meta default device, the host store's lookups, weighted lookups and explicit
    updates give the same numbers as without it: every tensor it makes names its device."""
    optimizer = SparseOptimizer(kind=OptimizerKind.ROWWISE_ADAGRAD, lr=0.5)
    shapes = [(6, 4), (5, 8)]
    init = [torch.arange(r * w, dtype=torch.float32).reshape(r, w) / 10 for r, w in shapes]
    bags = [
        Bags(indices=torch.tensor([1, 2, 5]), offsets=torch.tensor([0, 2, 3])),
        Bags(
            indices=torch.tensor([0, 4]),
            offsets=torch.tensor([0, 1, 2]),
            weights=torch.tensor([2.0, 3.0]),
        ),
    ]
    rows = [torch.tensor([0, 3]), torch.tensor([1])]
    grads = [torch.ones(2, 4), torch.full((1, 8), 2.0)]

    def run(meta: bool) -> list[torch.Tensor]:
        store = FbgemmStore(shapes, optimizer)
        store.load(init)
        with torch.device("meta") if meta else torch.device("cpu"):
            pooled, _ = store.pooled(bags, keep_for_backward=False)
            store.apply_row_grads(rows, grads)
        return [p.clone() for p in pooled] + [w.clone() for w in store.weights()]

    for got, want in zip(run(True), run(False), strict=True):
        assert got.device.type == "cpu"
        torch.testing.assert_close(got, want, rtol=0, atol=0)
