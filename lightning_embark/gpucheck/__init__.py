"""``python -m lightning_embark.gpucheck``: the engine on whatever device is here.

For a machine with a GPU and a bare image (torch with CUDA, triton, Lightning; no
torchrec, no fbgemm-gpu): it runs the kernels' self-check (compiled Triton kernels
against the torch reference, bit for bit), the engine on one GPU (world 1, NCCL) and on
one process per GPU when there are several, against a float64 oracle of the unsharded
tables within the tolerance the arithmetic allows (:mod:`._check`), and times each
cluster type's forward and backward with the fused kernels against the unfused torch
ops. It prints tables and writes one JSON file. ``--device cpu`` runs the same on CPU
ranks over gloo, the kernels in Triton's interpreter (the test suite does, small).
"""

from lightning_embark.gpucheck._check import (
    CheckConfig,
    format_report,
    run_check,
    write_report,
)

__all__ = ["CheckConfig", "format_report", "run_check", "write_report"]
