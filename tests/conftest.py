"""Suite-wide setup: the tests are CPU-only, so Triton kernels run in Triton's interpreter.

``TRITON_INTERPRET=1`` must be set before triton is first imported (torchrec and fbgemm
import it), so it is set here, before any test module is collected.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
