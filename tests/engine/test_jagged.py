"""The jagged batch's index helpers: the same values as torch's own ops, with nothing read
on the host that a GPU would wait for."""

from __future__ import annotations

import torch

from lightning_embark._host_work import to_device
from lightning_embark.accounting import DispatchCounter
from lightning_embark.engine._jagged import bin_counts, segment_index


def test_bin_counts_equal_bincount_without_a_host_read() -> None:
    gen = torch.Generator().manual_seed(0)
    keys = torch.randint(0, 17, (300,), generator=gen)
    counter = DispatchCounter()
    with counter.counting():
        counts = bin_counts(keys, 20)
    assert torch.equal(counts, torch.bincount(keys, minlength=20))
    assert counter.snapshot().device_syncs == 0
    assert bin_counts(keys[:0], 3).tolist() == [0, 0, 0]


def test_segment_index_and_host_lists_queue_their_copies() -> None:
    """Host lists reach the device through :func:`to_device` (host work, then a copy that
    does not wait), so gathering segments reads nothing back."""
    counter = DispatchCounter()
    with counter.counting():
        index = segment_index([5, 0, 9], [2, 3, 1], torch.device("cpu"))
        values = to_device([1, 2, 3], dtype=torch.int32, device=torch.device("cpu"))
    assert index.tolist() == [5, 6, 0, 1, 2, 9]
    assert values.dtype == torch.int32 and values.tolist() == [1, 2, 3]
    snapshot = counter.snapshot()
    assert snapshot.device_syncs == 0
    assert sum(n for s, n in snapshot.syncs.items() if s.host_work) >= 1  # made on the host
