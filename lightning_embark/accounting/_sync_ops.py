"""Which calls would stall the host on CUDA: decided by op, because on a CPU run every
tensor is a host tensor.

A CUDA kernel launch returns at once; the host waits for the device only where it needs a
value the device computes. In PyTorch that is, by op (``aten/src/ATen/native``, and the
ops' tags in ``native_functions.yaml``, which torch exposes as ``OpOverload.tags``):

* ``data_dependent_output`` ops return a host value computed from the data:
  ``_local_scalar_dense`` (what ``item()``, ``int(t)``, ``float(t)``, ``bool(t)`` and
  ``if t:`` dispatch), ``equal``, ``allclose``. The value is copied to the host, and
  the copy waits for the stream.
* ``dynamic_output_shape`` ops size their output from the data, so the host reads a count
  before it can allocate: ``nonzero``, ``argwhere``, ``masked_select``, the ``unique``
  family (``_unique``, ``_unique2``, ``unique_dim``, ``unique_consecutive``...: the number
  of distinct values), ``bincount`` (CUDA's ``_bincount_cuda_template`` reads
  ``self.min()`` and ``self.max()`` on the host), ``repeat_interleave.Tensor`` (the
  sum of the repeats; not when ``output_size`` is given), ``index.Tensor`` with a
  boolean mask (a ``nonzero`` inside; integer indices do not sync), ``_ctc_loss``,
  ``linalg_lstsq``.
* Not tagged, same cause: ``index_put_`` with a boolean mask (``x[mask] = v``: the
  mask goes through ``nonzero``), ``histc`` with ``min == max`` (the data's extremes
  are read), and the sparse ops that coalesce an uncoalesced COO tensor
  (``_coalesce``; ``_sparse_addmm`` / ``addmm`` / ``mm`` with a sparse operand: CUDA's
  ``s_addmm_out_sparse_dense_cuda`` calls ``coalesce()``, whose nnz after merging
  duplicates comes to the host).

Copies between host and device are not ATen ops that a CPU run can tell apart (``to``
and ``copy_`` between two CPU tensors dispatch the same as a device-to-host copy would,
and ``tolist`` / ``numpy`` / ``cpu`` of a CPU tensor dispatch nothing), so they are
decided by the Python call (:data:`HOST_READS`, :data:`HOST_WRITES`): ``Tensor.tolist``,
``Tensor.numpy`` and ``Tensor.cpu`` read the tensor on the host (device to host), and
``torch.tensor`` / ``torch.as_tensor`` of Python data with a ``device`` copy host data to
that device. ATen's ``copy_kernel_cuda`` runs a copy between host and device that is not
``non_blocking`` as ``memcpy_and_sync`` (``cudaMemcpyAsync`` then
``cudaStreamSynchronize``), so both directions wait for everything queued on the stream.
``Tensor.to(...)`` is left out: on a CPU run ``.to(self.device)`` and ``.to("cpu")``
cannot be told apart.

A composite op is seen as the ops it decomposes into on the CPU, which may differ from
CUDA's kernel (``one_hot`` reads its input's minimum on the CPU only): the counts are those
of the code paths the CPU runs.

Ops that need no sync although their output is data-dependent in value only (``sort``,
``cumsum``, ``aminmax``, ``nonzero_static``, ``index_select``, ``embedding_bag``...) are
not listed: the device computes them without the host.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

#: Reasons, by kind (reported with every counted sync).
SCALAR = "value to the host"
SHAPE = "data-dependent output shape"
COALESCE = "sparse coalesce (data-dependent nnz)"
DEVICE_TO_HOST = "device-to-host copy"
HOST_TO_DEVICE = "host-to-device copy (synchronous)"

#: Python-level calls that read a tensor on the host (``Tensor`` methods).
HOST_READS = ("tolist", "numpy", "cpu")
#: Python-level calls that copy Python data to a device when given one (``torch`` functions).
HOST_WRITES = ("tensor", "as_tensor")

_BOOL_TYPES = (torch.bool, torch.uint8)
_SPARSE_MM = ("_sparse_addmm", "addmm", "mm", "_sparse_mm")


def sync_reason(func: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> str | None:
    """Why the ATen op ``func`` called with ``args`` / ``kwargs`` would make the host wait
    for a CUDA device, or None when it would not (see the module docstring)."""
    name = func._schema.name.partition("::")[2]
    overload = func._overloadname
    tags = func.tags
    if torch.Tag.data_dependent_output in tags:
        return SCALAR
    if name == "repeat_interleave":
        return SHAPE if _argument(func, args, kwargs, "output_size") is None else None
    if name == "index" and overload == "Tensor":
        return SHAPE if _has_mask(args[1] if len(args) > 1 else kwargs.get("indices")) else None
    if torch.Tag.dynamic_output_shape in tags:
        return SHAPE
    if name in ("index_put_", "index_put", "_index_put_impl_"):
        return SHAPE if _has_mask(args[1] if len(args) > 1 else kwargs.get("indices")) else None
    if name == "histc":
        low, high = _argument(func, args, kwargs, "min"), _argument(func, args, kwargs, "max")
        return SHAPE if (low or 0) == (high or 0) else None
    if name == "_coalesce":
        return COALESCE
    if name in _SPARSE_MM and any(_uncoalesced(a) for a in args):
        return COALESCE
    return None


def _argument(func: Any, args: Sequence[Any], kwargs: Mapping[str, Any], name: str) -> Any:
    """The value of argument ``name`` of this call (positional or keyword; its default
    when absent)."""
    if name in kwargs:
        return kwargs[name]
    for index, argument in enumerate(func._schema.arguments):
        if argument.name == name:
            if index < len(args):
                return args[index]
            return argument.default_value if argument.has_default_value() else None
    return None


def _has_mask(indices: Any) -> bool:
    """Whether an ``index`` / ``index_put_`` index list holds a boolean (or byte) mask."""
    return any(isinstance(i, torch.Tensor) and i.dtype in _BOOL_TYPES for i in indices or ())


def _uncoalesced(value: Any) -> bool:
    return (
        isinstance(value, torch.Tensor)
        and value.layout is torch.sparse_coo
        and not value.is_coalesced()
    )
