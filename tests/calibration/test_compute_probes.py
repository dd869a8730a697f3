"""Compute probes in one process: a UB requester's work fits like a lookup, every probe
names its device, and a process group that cannot measure the device is refused."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from lightning_embark.calibration._compute_probes import (
    lookup_shapes,
    measure_codecs,
    measure_dense_matmul,
    measure_dp_dense,
    measure_lookup,
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
    matmuls. One thread, as the ranks run it."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        record = measure_dense_matmul(rows=64, in_dim=32, out_dim=8, repeats=2)
    finally:
        torch.set_num_threads(threads)
    assert record["flops"] == 6 * 64 * 32 * 8 and record["seconds"] > 0


def _untimed(record: dict) -> dict:
    return {k: v for k, v in record.items() if not (k.endswith("_s") or k == "seconds")}


class _MetaSpy(TorchDispatchMode):
    """Records every op whose result lands on ``meta``: meta tensors are permissive (an op
    mixing them with CPU tensors may well run), so a probe that discards a result made
    on the wrong device would otherwise go unseen."""

    def __init__(self) -> None:
        super().__init__()
        self.made: list[str] = []

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor) and leaf.is_meta:
                self.made.append(str(func))
        return out


def test_compute_probes_name_their_device_for_every_tensor() -> None:
    """On a GPU, a probe tensor made without its device would land on the CPU and time
    (or break) the wrong thing. Run the probes on explicit CPU tensors with ``meta`` as
    torch's default device (tests/engine/test_device_discipline.py): a tensor made
    without naming its device lands on meta, which the spy records, and the records must
    match the plain run's. The torch store, as on CUDA (fbgemm's store is CPU-only)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:

        def run() -> list[dict]:
            cpu = torch.device("cpu")
            return [
                measure_lookup(
                    rows=500, dim=8, batch=16, hotness=4, repeats=1, store="torch", device=cpu
                ),
                measure_unique_pooling(
                    rows=500, dim=8, batch=16, hotness=4, repeats=1, device=cpu
                ),
                measure_codecs(rows=32, dim=8, repeats=1, device=cpu),
                measure_dp_dense(rows=256, dim=4, ids=64, repeats=1, device=cpu),
                measure_dense_matmul(rows=16, in_dim=8, out_dim=4, repeats=1, device=cpu),
            ]

        plain = run()
        with torch.device("meta"), _MetaSpy() as spy:
            on_meta = run()
    finally:
        torch.set_num_threads(threads)
    assert spy.made == []
    codecs = 2
    for i, (a, b) in enumerate(zip(plain, on_meta, strict=True)):
        if i == codecs:
            assert a.keys() == b.keys() == {"fp16", "bf16", "fp8", "int8"}
            assert all(_untimed(a[k]) == _untimed(b[k]) for k in a)
        else:
            assert _untimed(a) == _untimed(b)
    assert plain[0]["kernel"] == "TorchStore" and plain[0]["unique_rows"] > 0


def test_measure_all_refuses_a_backend_that_cannot_measure_the_device() -> None:
    """A gloo group cannot run NCCL's CUDA collectives: refused before any probe, naming
    both, instead of failing inside the first all-to-all."""
    import torch.distributed as dist

    from lightning_embark.calibration._probes import measure_all
    from lightning_embark.errors import ConfigError

    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    try:
        with pytest.raises(ConfigError, match=r"cuda:0 needs a nccl process group.*gloo"):
            measure_all(ranks_per_host=1, device=torch.device("cuda", 0))
    finally:
        dist.destroy_process_group()
