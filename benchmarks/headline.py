"""EMBark's headline evaluation side by side: measured on the emulated cluster, estimated at scale.

Runs MLPerf DLRM-DCNv2, T180, T200 and T510 (rows capped, synthetic data) on the emulated
2 hosts x 2 ranks cluster against the strongest torchrec configuration: ``torchrec``
(torchrec's own planner) and ``torchrec-fp16`` (its fp16 qcomms), both through
``TrainPipelineSparseDist``; ``torchrec-twrw`` (every table table-row-wise, the EMBark
paper's baseline) for the paper's comparison; ``embark`` (lossless automatic plan),
``embark-compressed`` (the plan may use ``--allow``'s compressions) and
``embark-towers-compressed`` (the same, with ``towers="auto"``: the planner decides
whether and which towers, and the report says when it chose none). Every run goes through
its strategy's input pipeline and sends its dense gradients in ``--dense-compression``.

Exposed communication for every run: each run is a pair, the strategy on the shaped link
and on the same hosts unshaped, back to back, which first alternating; the difference of
the two median steps is what the link costs the step, whatever any counter says.

The comm-bound rows use a light dense part (dot interaction, bottom MLP 128, top MLP
128-64-1; 16-1 for T510, whose 130k pairwise features would make a 128-wide top MLP the
biggest thing on the wire) and a link rate set on the reference by a pilot
(:mod:`_headline.pilot`): ``torchrec-fp16`` runs unshaped once and shaped up to 3 times,
the rate moved each time by ``r* = r E / E*`` with ``E* = s / (1 - s) T_unshaped``, until
30-50% of its step is exposed (``s`` = 40% aimed at). T180 runs with every table at width
112 (the bench DLRM needs one width). One compute-bound row keeps MLPerf's full
DLRM-DCNv2 dense part at the emulation's default 800 Mbit/s.

Each model runs ``--repeats`` (6) alternating paired repeats: repeat ``r`` runs the
strategies in an order rotated by ``r``, and every ratio is taken within a repeat before
its Hodges-Lehmann estimate and exact Wilcoxon signed-rank interval over repeats (6
repeats reach 96.9%, 5 at most 93.75%); a row is called faster than its reference only
when the interval's upper bound is below 1.

A second table estimates the strategies on ``dgx-h100`` at 8 x 8 and 16 x 8 ranks with
the calibrated cost model (embedding part only, as ``benchmarks/planner_quality.py``),
torchrec's planner given ``--torchrec-timeout`` (600 s) to finish its search.

Writes ``headline.json``, ``headline.md`` and ``headline.png`` into ``--out-dir``; progress
(model, repeat, strategy, link) goes to stderr. Needs root for the emulated cluster
(network namespaces and ``tc``); without it the runs fall back to loopback, no rate is
chosen and no exposed communication is reported.

    python benchmarks/headline.py --out-dir headline [--repeats 6] [--steps 10] \\
        [--models mlperf,t180,t200,t510,mlperf-dcnv2] [--rate-mbit t180=120 ...] \\
        [--batch-size t510=128 ...] [--allow fp16,bf16] [--dense-compression fp32] \\
        [--torchrec-timeout 600] [--no-exposed] [--no-estimates] [--quick]

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
