"""Rerun the kernel tests in a process where TRITON_INTERPRET=1 precedes triton's import."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_embark.kernels._ops import interpreted

HERE = Path(__file__).resolve().parent


@pytest.mark.skipif(
    interpreted(), reason="the kernels already run in the interpreter in this process"
)
def test_kernel_tests_pass_in_a_fresh_interpreter_process() -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--import-mode=importlib",
            str(HERE),
            f"--ignore={HERE / 'test_benchmark_smoke.py'}",
        ],  # needs no in-process interpreter, ran here
        cwd=HERE.parents[1],
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    summary = result.stdout.strip().splitlines()[-1]
    assert re.search(r"(?<!\d)1 skipped", summary), f"only this test may skip there: {summary}"
