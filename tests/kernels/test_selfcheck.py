"""``python -m lightning_embark.kernels.selfcheck``: the device check, run here in the
interpreter."""

from __future__ import annotations

import pytest
import torch

from lightning_embark.kernels import _ops as ops
from lightning_embark.kernels import selfcheck


def test_random_cases_match_the_reference(triton_cpu: str) -> None:
    results = selfcheck.run_checks(torch.device("cpu"), num_cases=4, seed=3, wide=False)
    assert {r.op for r in results} == {
        "pack",
        "unpack_reduce",
        "pack (row runs)",
        "unpack (row runs)",
    }
    assert all(r.ok for r in results), selfcheck.summary(results)
    assert "FAILED" not in selfcheck.summary(results)


def test_a_wrong_kernel_is_reported(triton_cpu: str, monkeypatch: pytest.MonkeyPatch) -> None:
    launcher = ops.pack_triton

    def off_by_one(*args, **kwargs):
        payload, count = launcher(*args, **kwargs)
        if payload.numel():
            payload[-1] ^= 1
        return payload, count

    monkeypatch.setattr(ops, "pack_triton", off_by_one)
    results = selfcheck.run_checks(torch.device("cpu"), num_cases=3, seed=5, wide=False)
    failed = [r for r in results if not r.ok]
    assert failed and all(r.op in ("pack", "pack (row runs)") for r in failed)
    assert "1 bytes differ" in selfcheck.summary(results) and "FAILED" in selfcheck.summary(
        results
    )


def test_main_rejects_no_cases() -> None:
    with pytest.raises(SystemExit):
        selfcheck.main(["--cases", "0"])
