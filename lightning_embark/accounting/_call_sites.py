"""Call sites of the dispatch counter: which frame of the Python stack an op belongs to.

The site of an op is the innermost frame outside torch, the standard library and the
counter (``lightning_embark/...``, ``triton_kernels/...``, ``torchrec/...``,
``fbgemm_gpu/...`` from their package roots, any other package from its install root):
the code that called into torch. Frames of Triton's interpreter mark ops dispatched inside
an interpreted kernel launch. The innermost frame of all, torch's own included but not the
dispatch machinery's, is what :data:`KNOWN_HOST_READS` matches: reads of host tensors by
design in code we do not own.
"""

from __future__ import annotations

import functools
import importlib.util
import linecache
import os
import sys
import sysconfig
from pathlib import Path
from types import CodeType

import torch

#: The counter's own module, whose frames are never a site.
COUNTER_FILE = str(Path(__file__).resolve().parent / "_dispatch.py")

_SITE, _TRITON, _SKIP = range(3)


@functools.cache
def _roots() -> tuple[tuple[str, str], ...]:
    """``(directory, name)`` of the packages whose call sites are named from their root."""
    found = []
    for package, name in (
        ("lightning_embark", "lightning_embark"),
        ("lightning_embark.kernels", "triton_kernels"),
        ("torchrec", "torchrec"),
        ("fbgemm_gpu", "fbgemm_gpu"),
    ):
        spec = importlib.util.find_spec(package)
        for location in (spec.submodule_search_locations or []) if spec else []:
            found.append((str(Path(location).resolve()) + os.sep, name))
    return tuple(sorted(found, key=lambda r: -len(r[0])))  # the kernels before the package


@functools.cache
def _skipped() -> tuple[str, str, str, str | None]:
    """This counter's file, torch's and the standard library's directories (a call site is
    the code that called into them), and triton's (its interpreter runs kernels)."""
    spec = importlib.util.find_spec("triton")
    locations = spec.submodule_search_locations if spec else None
    return (
        COUNTER_FILE,
        str(Path(torch.__file__).resolve().parent) + os.sep,
        str(Path(sysconfig.get_paths()["stdlib"]).resolve()) + os.sep,
        str(Path(locations[0]).resolve()) + os.sep if locations else None,
    )


_KINDS: dict[CodeType, tuple[int, str]] = {}


def _kind(code: CodeType) -> tuple[int, str]:
    """What a frame of ``code`` is, and its file as a call site names it (cached)."""
    known = _KINDS.get(code)
    if known is not None:
        return known
    path = str(Path(code.co_filename).resolve()) if code.co_filename[:1] != "<" else ""
    here, torch_dir, stdlib, triton = _skipped()
    installed = (
        f"{os.sep}site-packages{os.sep}" in path or f"{os.sep}dist-packages{os.sep}" in path
    )
    owned = next((f"{n}/{path[len(r) :]}" for r, n in _roots() if path.startswith(r)), None)
    kind: tuple[int, str]
    if not path or path == here or path.startswith(torch_dir):
        kind = (_SKIP, "")
    elif owned is not None:
        kind = (_SITE, owned)
    elif triton is not None and path.startswith(triton):
        kind = (_TRITON, "")
    elif path.startswith(stdlib) and not installed:
        kind = (_SKIP, "")
    else:  # another package (Lightning...) or a script: named from its install root
        kind = (_SITE, path.rpartition(("site-packages" if installed else "") + os.sep)[2])
    _KINDS[code] = kind
    return kind


def call_site(depth: int = 1) -> tuple[str, bool, tuple[str, int]]:
    """The call site of the op being dispatched on this thread, as ``file:line`` (the
    innermost frame outside torch, the standard library and this counter); whether it is
    inside an interpreted Triton kernel (see the module docstring); and the innermost frame
    outside this counter, torch's included (its file and line: what
    :data:`KNOWN_HOST_READS` matches)."""
    frame = sys._getframe(depth)
    inner: tuple[str, int] | None = None
    while frame is not None:
        code = frame.f_code
        if inner is None and not _machinery(code):
            inner = (code.co_filename, frame.f_lineno)
        kind, name = _kind(code)
        if kind == _SITE:
            return f"{name}:{frame.f_lineno}", False, inner or ("", 0)
        if kind == _TRITON:
            return "(Triton interpreter)", True, inner or ("", 0)
        frame = frame.f_back  # type: ignore[assignment]
    return "(torch)", False, inner or ("", 0)


#: torch's own frames between a dispatched op and the mode's handler (dynamo's wrapper of
#: ``__torch_dispatch__``, the dispatch helpers), which are not the op's caller.
_MACHINERY = (
    "/torch/_dynamo/",
    "/torch/_compile.py",
    "/torch/utils/_python_dispatch.py",
    "/torch/_ops.py",
)


def _machinery(code: CodeType) -> bool:
    name = code.co_filename.replace(os.sep, "/")
    return (
        name in (COUNTER_FILE.replace(os.sep, "/"), __file__.replace(os.sep, "/"))
        or name[:1] == "<"
        or any(m in name for m in _MACHINERY)
    )


#: Host tensors by design in code we do not own, read where a CPU run cannot tell them from
#: device tensors: ``(file, source text)`` of the innermost Python frame of the read.
#: torch's optimizers keep their step count on the host unless ``fused`` or ``capturable``
#: (which never read it there); torchrec's row-wise Adagrad keeps its step there too; fbgemm's
#: table-batched kernels keep their iteration counter (``iter_cpu``) and feature widths
#: (``feature_dims``, moved to the host on the first call) there.
KNOWN_HOST_READS: tuple[tuple[str, str], ...] = (
    ("torch/optim/optimizer.py", "x.item() if isinstance(x, torch.Tensor) else x"),
    ("torchrec/optim/rowwise_adagrad.py", "step_t.item()"),
    ("fbgemm_gpu/split_table_batched_embeddings_ops_training.py", "self.iter_cpu"),
    ("fbgemm_gpu/split_table_batched_embeddings_ops_training.py", "self.feature_dims.cpu()"),
)


def known_host_read(frame: tuple[str, int]) -> bool:
    """Whether the innermost frame of a read (``(file, line)``, :func:`call_site`'s third
    value) reads a host tensor of :data:`KNOWN_HOST_READS`."""
    path, line = frame
    posix = path.replace(os.sep, "/")
    rules = [text for file, text in KNOWN_HOST_READS if posix.endswith("/" + file)]
    return bool(rules) and any(text in linecache.getline(path, line) for text in rules)
