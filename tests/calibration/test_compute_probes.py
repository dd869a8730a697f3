"""Compute probes in one process: a UB requester's work fits like a lookup."""

from __future__ import annotations

import torch

from lightning_embark.calibration._compute_probes import (
    lookup_shapes,
    measure_dense_matmul,
    measure_unique_pooling,
)
from lightning_embark.calibration._fit import fit_lookup


def test_unique_pooling_records_fit_like_lookups() -> None:
    points = [
        measure_unique_pooling(rows=n, dim=w, batch=b, hotness=h, repeats=1)
        for b, h, w, n in lookup_shapes(64, 16, 2000)
    ]
    assert all(
        p["kernel"] == "unique-pool" and 0 < p["unique_rows"] <= min(p["ids"], p["rows"])
        for p in points
    )
    assert all(p["forward_s"] > 0 and p["backward_s"] > 0 for p in points)
    fit = fit_lookup(points)
    assert fit.bandwidth > 0 and min(fit.bag, fit.id, fit.unique_row) >= 0


def test_dense_matmul_counts_a_tower_modules_forward_and_backward_flops() -> None:
    """``y = x W``, ``dx = g W^T`` and ``dW = x^T g``: three ``2 rows in out`` FLOP
    matmuls. One thread, as the ranks run it: a BLAS thread pool started in the test
    process would be inherited, broken, by the gloo ranks later tests fork."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        record = measure_dense_matmul(rows=64, in_dim=32, out_dim=8, repeats=2)
    finally:
        torch.set_num_threads(threads)
    assert record["flops"] == 6 * 64 * 32 * 8 and record["seconds"] > 0
