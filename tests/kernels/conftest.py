"""Run the Triton kernels in Triton's CPU interpreter.

``TRITON_INTERPRET=1`` only takes effect if it is set before ``triton`` is first
imported (triton's own ``tl.max``, ``tl.zeros``... are jit functions decorated at
import). This conftest sets it, which suffices when pytest starts in this folder
(``pytest tests/kernels``). In a whole-suite run, earlier test modules import
torchrec/fbgemm and with them triton; then the in-process kernel tests skip and
``test_interpreter_suite.py`` reruns this folder in a fresh interpreter process.
"""

from __future__ import annotations

import os

os.environ.setdefault(
    "TRITON_INTERPRET", "1"
)  # the ``triton_cpu`` fixture is the suite's (tests/conftest.py)
