"""Validation AUC of DLRM over DMT towers against flat DLRM, on Frappe and MovieLens-1M.

Compressing towers change the model (the interaction reads each tower's output instead
of its features' vectors), so what they cost in accuracy is measured here, on two real
datasets, over paired seeds: for every seed the flat DLRM (dot interaction, one table of
width 16 per feature) trains, then every variant (a tower module, its ratio, a number of
towers and a partition) trains with the same batches in the same order and the same
tables' start. Each variant's mean AUC difference to flat comes with its 95% paired-t
interval over the seeds; it keeps accuracy when the mean is within 0.001 of flat's and
the interval's lower bound above -0.002. The partitions are compared the same way:
learned (the flat model's warm-up affinity) against statistics-only and random.

Training is single-process, on the unsharded towered model: the engine is exact against
it (tested elsewhere), so sharding does not change the AUC. Training times are indicative
only (a shared 2-core machine; compare them within one run).

Usage::

    python benchmarks/towers_quality.py [--datasets frappe,movielens] [--seeds 0-9]
        [--variants "dot r4,dcn r4"] [--warmup-steps 200] [--data-dir ../shared/data]
        [--json out.json] [--plot out.png] [--smoke]

The parts live in the sibling package ``_towers_quality/`` (its ``__init__`` lists them).
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, this file's folder is on sys.path and its sibling package imports as
# is; loaded by path (the tests' ``load_module``) it is not, so put it there.
_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from _towers_quality.cli import main  # noqa: E402

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
