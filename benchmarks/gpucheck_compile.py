"""How long the GPU check's first CUDA run spends compiling Triton kernels, estimated anywhere.

A first run compiles each specialization of the pack and unpack kernels once (Triton keys a
compile on the constexprs and the arguments' types). This script

1. records which specializations the GPU check's CUDA run launches: its self-check cases
   (``wide``, as on CUDA) and one rank's engine steps (the exact step, the counted step and
   the timed Triton steps), run in Triton's interpreter with the two kernels replaced by a
   recorder, so that nothing is computed;
2. compiles a sample of them for an sm_90 target with Triton's bundled ``ptxas`` (no GPU
   needed), timing each;

and estimates the compile time as ``pack variants x mean pack compile + unpack variants x
mean unpack compile`` (on this machine's cores; a GPU machine's are usually faster).

Usage: ``python benchmarks/gpucheck_compile.py [--kernel-cases 50] [--sample 15] [--json out]``
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

#: Triton type strings of the tensor dtypes the kernels take.
_POINTERS = {
    "torch.float32": "*fp32",
    "torch.float16": "*fp16",
    "torch.bfloat16": "*bf16",
    "torch.int16": "*i16",
    "torch.int32": "*i32",
    "torch.int64": "*i64",
    "torch.uint8": "*u8",
}


def _record(path: Path, kernel_cases: int, timing_batch: int) -> None:
    """Step 1, in a process whose triton runs interpreted (see the module docstring)."""
    import functools

    import torch
    import torch.distributed as dist

    import lightning_embark.kernels._packing as packing
    import lightning_embark.kernels._unpacking as unpacking
    from lightning_embark.gpucheck import _ranks
    from lightning_embark.gpucheck._check import DEFAULTS
    from lightning_embark.gpucheck._counts import counted_step
    from lightning_embark.kernels import BACKEND_ENV
    from lightning_embark.kernels.selfcheck import run_checks
    from lightning_embark.testing import free_port

    seen: dict[str, set[tuple[Any, ...]]] = {"pack": set(), "unpack": set()}

    class Recorder:
        def __init__(self, name: str) -> None:
            self.name = name

        def __getitem__(self, grid: Any) -> Any:
            def launch(*args: Any, **kwargs: Any) -> None:
                types = tuple(
                    _POINTERS[str(a.dtype)] if isinstance(a, torch.Tensor) else "i32" for a in args
                )
                constexprs = tuple(sorted(kwargs.items()))
                seen[self.name].add((types, constexprs))

            return launch

    packing._pack_kernel = Recorder("pack")
    unpacking._unpack_kernel = Recorder("unpack")
    cpu = torch.device("cpu")
    run_checks(cpu, num_cases=kernel_cases, seed=0, wide=True)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    os.environ[BACKEND_ENV] = "triton"
    dist.init_process_group("gloo", rank=0, world_size=1)
    sizes = DEFAULTS["cuda"]
    job = _ranks.RankJob(
        device="cpu",
        rendezvous="",
        out="",
        batch=sizes["batch"],
        timing_batch=timing_batch,
        steps=1,
        warmup=0,
        store="torch",
        seed=0,
    )
    _ranks._exact_step(0, 1, job, cpu)
    engine = functools.partial(_ranks._engine, job=job, device=cpu)
    counted_step(0, 1, batch=job.batch, seed=2, device=cpu, engine=engine)
    _ranks.BACKENDS = ("triton",)  # type: ignore[assignment]  # the torch ops launch none
    _ranks._timings(0, 1, job, cpu)
    dist.destroy_process_group()
    path.write_text(json.dumps({n: sorted(map(list, v)) for n, v in seen.items()}))


def _compile(records: Path, sample: int, out: Path) -> None:
    """Step 2, in a process whose triton compiles."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from lightning_embark.kernels._packing import _pack_kernel
    from lightning_embark.kernels._unpacking import _unpack_kernel

    target = GPUTarget("cuda", 90, 32)
    seen = json.loads(records.read_text())
    rng = random.Random(0)
    result: dict[str, Any] = {}
    for name, fn in (("pack", _pack_kernel), ("unpack", _unpack_kernel)):
        variants = seen[name]
        seconds = []
        for types, constexprs in rng.sample(variants, min(sample, len(variants))):
            consts = {k: v for k, v in constexprs if k != "enable_fp_fusion"}
            signature = dict(
                zip(fn.arg_names, [*types, *["constexpr"] * len(consts)], strict=True)
            )
            source = ASTSource(fn, signature, constexprs=consts)
            start = time.perf_counter()
            triton.compile(source, target=target, options={"enable_fp_fusion": False})
            seconds.append(time.perf_counter() - start)
        result[name] = {
            "variants": len(variants),
            "compiled": len(seconds),
            "mean_s": statistics.fmean(seconds),
            "max_s": max(seconds),
        }
    result["estimated_compile_s"] = sum(r["variants"] * r["mean_s"] for r in result.values())
    out.write_text(json.dumps(result, indent=2))


def _child(*args: str, interpret: bool) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    with tempfile.TemporaryDirectory() as cache:  # compile afresh, as a first run does
        env["TRITON_CACHE_DIR"] = cache
        subprocess.run([sys.executable, __file__, *args], env=env, check=True)


def main(argv: list[str] | None = None) -> int:
    from lightning_embark.gpucheck._check import DEFAULTS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernel-cases", type=int, default=DEFAULTS["cuda"]["kernel_cases"])
    parser.add_argument("--timing-batch", type=int, default=DEFAULTS["cuda"]["timing_batch"])
    parser.add_argument("--sample", type=int, default=15, help="compiles timed per kernel")
    parser.add_argument("--json", type=Path, default=None, help="write the result here")
    parser.add_argument("--record", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--compile", type=Path, nargs=2, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.kernel_cases < 1 or args.sample < 1:
        parser.error("--kernel-cases and --sample must be >= 1")
    if args.record is not None:
        _record(args.record, args.kernel_cases, args.timing_batch)
        return 0
    if args.compile is not None:
        _compile(args.compile[0], args.sample, args.compile[1])
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        records, out = Path(tmp) / "variants.json", Path(tmp) / "result.json"
        record = ["--record", str(records), "--kernel-cases", str(args.kernel_cases)]
        _child(*record, "--timing-batch", str(args.timing_batch), interpret=True)
        _child("--compile", str(records), str(out), "--sample", str(args.sample), interpret=False)
        result = json.loads(out.read_text())
    result["kernel_cases"] = args.kernel_cases
    for name in ("pack", "unpack"):
        r = result[name]
        print(
            f"{name}: {r['variants']} specializations; {r['compiled']} compiled for sm_90 in "
            f"{r['mean_s']:.2f} s each on average (at most {r['max_s']:.2f} s)"
        )
    print(
        f"estimated compile time of a first CUDA run with {args.kernel_cases} kernel cases: "
        f"{result['estimated_compile_s']:.0f} s on this machine"
    )
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
