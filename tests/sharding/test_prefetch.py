"""The input pipeline's batch checks: NaN or inf outside the sparse features rejects a batch."""

from __future__ import annotations

import torch
from torchrec.datasets.utils import Batch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from lightning_embark.sharding._prefetch import nonfinite_error


def _batch(dense: torch.Tensor, labels: torch.Tensor) -> Batch:
    # Float weights in the sparse features are not what this check reads.
    kjt = KeyedJaggedTensor(
        keys=["f0"],
        values=torch.tensor([1, 2]),
        lengths=torch.tensor([1, 1]),
        weights=torch.tensor([float("nan"), 1.0]),
    )
    return Batch(dense_features=dense, sparse_features=kjt, labels=labels)


def test_a_finite_batch_passes() -> None:
    assert nonfinite_error(_batch(torch.zeros(2, 3), torch.ones(2))) is None
    assert nonfinite_error({"x": torch.arange(3), "y": [torch.ones(2)]}) is None


def test_non_finite_values_are_counted_and_named_where_they_are() -> None:
    dense = torch.zeros(2, 3)
    dense[0, 1] = float("nan")
    dense[1, 2] = float("inf")
    labels = torch.tensor([0.0, float("-inf")])
    error = nonfinite_error(_batch(dense, labels))
    assert error is not None
    message = str(error)
    assert "2 in batch.dense_features, 1 in batch.labels" in message
    assert "rank 0: the batch holds non-finite values (NaN or inf)" in message
    assert "torch.nan_to_num" in message
    nested = nonfinite_error({"dense": [torch.ones(1), torch.tensor([float("nan")])]})
    assert nested is not None and "1 in batch['dense'][1]" in str(nested)


def test_the_non_finite_check_of_a_host_batch_waits_for_no_device() -> None:
    """The dataloader's tensors are checked on the host before Lightning moves them: the
    counts read there are host work, not what a GPU step would wait for."""
    from lightning_embark.accounting import DispatchCounter

    counter = DispatchCounter()
    with counter.counting():
        assert nonfinite_error({"dense": torch.ones(4, 3), "labels": torch.zeros(4)}) is None
    snapshot = counter.snapshot()
    assert snapshot.device_syncs == 0, snapshot.syncs
    assert sum(snapshot.syncs.values()) == 2  # one count per floating-point tensor
