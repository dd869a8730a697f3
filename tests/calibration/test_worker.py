"""The calibration worker: its ``--sizes`` parser and the script path it is launched by."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from lightning_embark.calibration._worker import parse_sizes, rank_device, worker_script
from lightning_embark.errors import ConfigError


def test_parse_sizes() -> None:
    assert parse_sizes("4K,64K,1M,4096") == [4096, 65536, 1 << 20]
    assert parse_sizes([64, 4, 64]) == [4, 64]
    with pytest.raises(ConfigError, match="two distinct"):
        parse_sizes("4K")
    with pytest.raises(ConfigError, match="not a byte count"):
        parse_sizes("4K,lots")
    with pytest.raises(ConfigError, match="at least 4 bytes"):
        parse_sizes("2,4K")


def test_the_worker_script_runs_by_path() -> None:
    """``embark-calibrate`` launches the file by path under torchrun: it must parse its
    own arguments as a script (``--help`` exits 0 without a process group)."""
    done = subprocess.run(
        [sys.executable, str(worker_script()), "--help"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "--sizes" in done.stdout and "--device {cpu,cuda}" in done.stdout


def test_the_worker_takes_one_gpu_per_rank() -> None:
    """``LOCAL_RANK`` picks the GPU (one rank per GPU, as the engine runs); a CUDA worker
    not launched by torchrun is refused by name."""
    assert rank_device("cpu", None) == torch.device("cpu")
    assert rank_device("cuda", "3") == torch.device("cuda", 3)
    with pytest.raises(ConfigError, match="LOCAL_RANK"):
        rank_device("cuda", None)
    with pytest.raises(ConfigError, match="'cpu' or 'cuda'"):
        rank_device("mps", "0")
