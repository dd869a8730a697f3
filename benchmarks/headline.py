"""EMBark's headline evaluation side by side: measured on the emulated cluster, estimated at scale.

Runs MLPerf DLRM-DCNv2, T180, T200 and T510 (rows capped, synthetic data) on the emulated
2 hosts x 2 ranks cluster with five strategies: ``torchrec-twrw`` (every table
table-row-wise, EMBark's baseline), ``torchrec`` (torchrec's planner), ``torchrec-fp16``,
``embark`` (lossless) and ``embark-compressed`` (``embark`` whose automatic plan may use
``--allow``'s compressions). Every run uses the same dense exchange (``--dense-compression``).

The comm-bound rows use a light dense part (dot interaction, bottom MLP 128, top MLP
128-64-1; 16-1 for T510, whose 130k pairwise features would make a 128-wide top MLP the
biggest thing on the wire), so that the embedding exchange is a large part of a step, and a
link rate chosen per model by a pilot run of ``torchrec-twrw`` (:func:`pilot_rate`) so that
the baseline spends 25-50% of its step in embedding exchange, as on real clusters. T180
runs with every table at width 112 (:func:`uniform_width`): the bench DLRM needs one
width. One compute-bound row keeps MLPerf's full DLRM-DCNv2 dense part at the emulation's
default 800 Mbit/s.

Each model runs ``--repeats`` alternating paired repeats: repeat ``r`` runs the strategies
in an order rotated by ``r``, so slow drifts of the shared machine hit every strategy alike,
and ratios are taken within a repeat (paired) before their median.

A second table estimates the same strategies on ``dgx-h100`` at 8 x 8 and 16 x 8 ranks
with the calibrated cost model (embedding part only, as ``benchmarks/planner_quality.py``).

Writes ``headline.json``, ``headline.md`` and ``headline.png`` into ``--out-dir``; progress
(model, repeat, strategy) goes to stderr. Needs root for the emulated cluster (network
namespaces and ``tc``); without it the runs fall back to loopback and no rate is chosen.

    python benchmarks/headline.py --out-dir headline [--repeats 3] [--steps 10] \\
        [--models mlperf,t180,t200,t510,mlperf-dcnv2] [--rate-mbit t180=120 ...] \\
        [--batch-size t510=128 ...] [--allow fp16,bf16] [--dense-compression fp32] \\
        [--torchrec-timeout 120] [--no-estimates] [--quick]

The suite's code lives in the sibling package ``_headline/``, one module per part (its
``__init__`` lists them); this script is its documented command.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, this file's folder is on sys.path and its sibling package ``_headline``
# imports as is; loaded by path (the tests' ``load_module``) it is not, so put it there.
_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from _headline.cli import main  # noqa: E402

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
