"""fbgemm's table-batched embedding kernels (TBE) as a :class:`ShardStore`.

On a CUDA device where fbgemm's CUDA ops load (:func:`fbgemm_cuda_available`), the same
kernel runs with ``ComputeDevice.CUDA``: blocks in HBM (``EmbeddingLocation.DEVICE``),
or, with a plan's ``cache_load_factor`` below 1, in unified memory behind an LRU HBM
cache (``EmbeddingLocation.MANAGED_CACHING``). That path is written from fbgemm-gpu
1.8's source and covered on CPUs only through its pure parts (:func:`block_locations`,
:func:`tbe_cache_load_factor`, :func:`tbe_arguments`): it has not run on a GPU. A
cached kernel fetches a batch's missing rows itself (fbgemm's ``forward`` prefetches
when no ``prefetch`` call came first), so the store needs no prefetch pipeline.

On CPU, fbgemm-gpu-cpu 1.8.0 runs ``SplitTableBatchedEmbeddingBagsCodegen`` with
``EmbeddingLocation.HOST`` / ``ComputeDevice.CPU`` and the fused optimizers
``EXACT_SGD``, ``EXACT_ADAGRAD`` and ``EXACT_ROWWISE_ADAGRAD`` (their formulas equal
:class:`TorchStore`'s to fp32 rounding); ``SGD`` and ``ROWWISE_ADAGRAD`` are rejected
as deprecated. Its limits shape this store: widths must be multiples of 4, every
feature shares one batch size, and on CPU the row-wise Adagrad backward fails when
two features share a table, so each block is its own table read by one feature.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Sequence
from typing import Any

import torch

from lightning_embark.engine._optimizer import OptimizerKind, SparseOptimizer
from lightning_embark.engine.stores._base import (
    Bags,
    FlatBags,
    ShardStore,
    copy_optimizer_states,
)
from lightning_embark.errors import ConfigError

#: fbgemm's ``DEFAULT_ASSOC`` on CUDA: cache slots come in sets of this many rows.
CACHE_ASSOCIATIVITY = 32


def block_locations(device_type: str, cache_load_factors: Sequence[float | None]) -> list[str]:
    """fbgemm ``EmbeddingLocation`` member names of blocks with these cache factors.

    On the CPU every block is ``HOST`` (host memory is all there is; a factor changes
    nothing). On CUDA a block is ``DEVICE`` (wholly in HBM) unless its factor is below
    1, then ``MANAGED_CACHING`` (unified memory behind the HBM cache).

    Raises:
        ConfigError: a device type fbgemm's store does not run on.
    """
    if device_type == "cpu":
        return ["HOST"] * len(cache_load_factors)
    if device_type != "cuda":
        raise ConfigError(f"fbgemm's store runs on 'cpu' or 'cuda' devices, not {device_type!r}")
    return [
        "MANAGED_CACHING" if f is not None and f < 1.0 else "DEVICE" for f in cache_load_factors
    ]


def tbe_cache_load_factor(
    shapes: Sequence[tuple[int, int]], cache_load_factors: Sequence[float | None]
) -> float | None:
    """The kernel-wide ``cache_load_factor`` that gives the cached blocks their slots.

    fbgemm sizes one cache for all ``MANAGED_CACHING`` tables of a kernel:
    ``cache_load_factor * (their rows together)`` slots (rounded up to sets of
    :data:`CACHE_ASSOCIATIVITY`). The row-weighted mean of the blocks' factors gives the
    sum of the slots the plan gave them; None when no block is cached.
    """
    cached = [
        (rows, f)
        for (rows, _), f in zip(shapes, cache_load_factors, strict=True)
        if f is not None and f < 1.0
    ]
    if not cached:
        return None
    return sum(rows * f for rows, f in cached) / sum(rows for rows, _ in cached)


def tbe_arguments(
    shapes: Sequence[tuple[int, int]],
    optimizer: SparseOptimizer,
    *,
    device: torch.device,
    cache_load_factors: Sequence[float | None] | None = None,
) -> dict[str, Any]:
    """Keyword arguments of ``SplitTableBatchedEmbeddingBagsCodegen`` for these blocks.

    One table per block (see :class:`FbgemmStore`), ``ComputeDevice.CPU`` with
    ``HOST`` blocks on the CPU, ``ComputeDevice.CUDA`` with ``DEVICE`` or
    ``MANAGED_CACHING`` blocks on CUDA (:func:`block_locations`); cached blocks add
    the kernel-wide ``cache_load_factor`` (:func:`tbe_cache_load_factor`) and the LRU
    policy. Imports fbgemm, so call it only where fbgemm is installed.
    """
    from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import (
        CacheAlgorithm,
        EmbeddingLocation,
        PoolingMode,
    )
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import ComputeDevice

    kinds = {
        OptimizerKind.SGD: EmbOptimType.EXACT_SGD,
        OptimizerKind.ADAGRAD: EmbOptimType.EXACT_ADAGRAD,
        OptimizerKind.ROWWISE_ADAGRAD: EmbOptimType.EXACT_ROWWISE_ADAGRAD,
    }
    factors = list(cache_load_factors) if cache_load_factors is not None else [None] * len(shapes)
    if len(factors) != len(shapes):
        raise ConfigError(
            f"{len(factors)} cache load factors for {len(shapes)} blocks; give one per block "
            "(None for a block wholly in HBM)"
        )
    locations = block_locations(device.type, factors)
    compute = ComputeDevice.CPU if device.type == "cpu" else ComputeDevice.CUDA
    arguments: dict[str, Any] = {
        "embedding_specs": [
            (r, w, EmbeddingLocation[loc], compute)
            for (r, w), loc in zip(shapes, locations, strict=True)
        ],
        "optimizer": kinds[optimizer.kind],
        "learning_rate": optimizer.lr,
        "eps": optimizer.eps,
        "pooling_mode": PoolingMode.SUM,
        "weights_precision": SparseType.FP32,
    }
    if device.type == "cuda":
        arguments["device"] = device
        factor = tbe_cache_load_factor(shapes, factors)
        if factor is not None:
            arguments["cache_load_factor"] = factor
            arguments["cache_algorithm"] = CacheAlgorithm.LRU
    return arguments


class FbgemmStore(ShardStore):
    """fbgemm ``SplitTableBatchedEmbeddingBagsCodegen`` with a fused optimizer, on the
    host or (not yet run) on a CUDA device.

    One kernel table per block, one feature per table (shared tables trip the CPU
    row-wise Adagrad kernel), every block padded to the same bag count because the
    kernel takes one batch size for all features; padding bags are empty. Every tensor
    the store makes is on ``device``; inputs are expected there too.

    Args:
        shapes: ``(rows, width)`` per block.
        optimizer: The fused sparse optimizer.
        device: ``cpu`` (fbgemm's host kernels) or ``cuda:<i>`` (its CUDA kernels).
        cache_load_factors: Per block, the plan's HBM cache share (None: wholly in
            HBM); used on CUDA only (:func:`tbe_arguments`).
    """

    def __init__(
        self,
        shapes: Sequence[tuple[int, int]],
        optimizer: SparseOptimizer,
        *,
        device: torch.device | str = "cpu",
        cache_load_factors: Sequence[float | None] | None = None,
    ) -> None:
        super().__init__(shapes, optimizer)
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
            SplitTableBatchedEmbeddingBagsCodegen,
        )

        self.device = torch.device(device)
        arguments = tbe_arguments(
            self.shapes, optimizer, device=self.device, cache_load_factors=cache_load_factors
        )
        self._cached = "cache_load_factor" in arguments
        self._tbe = None
        if self.shapes:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self._tbe = SplitTableBatchedEmbeddingBagsCodegen(**arguments)
        self._col_starts = [0]
        for _, w in self.shapes:
            self._col_starts.append(self._col_starts[-1] + w)
        # Each block's first row in the one-width view of the weights (see _flat_rows).
        self._row_starts = torch.tensor(
            [0, *itertools.accumulate(r for r, _ in self.shapes)][:-1] or [0],
            dtype=torch.int64,
            device=self.device,
        )

    def _run(self, bags: Sequence[Bags], *, grad: bool) -> torch.Tensor:
        """One kernel call over every block, each padded to the largest bag count.

        The blocks' offsets are chained on the device (each block's start is the previous
        block's last offset, a one-element tensor): reading it on the host would make the
        host wait for the stream once per block.
        """
        assert self._tbe is not None
        batch = max(1, max(b.num_bags for b in bags))
        weighted = any(b.weights is not None for b in bags)
        offsets, indices, weights = [], [], []
        end = torch.zeros(1, dtype=torch.int64, device=self.device)
        for b in bags:
            offs = b.offsets.to(torch.int64) + end
            end = offs[-1:]
            offsets += [offs[:-1], end.expand(batch - b.num_bags)]
            indices.append(b.indices.to(torch.int64))
            if weighted:
                weights.append(
                    b.weights.float()
                    if b.weights is not None
                    else torch.ones(b.indices.numel(), device=self.device)
                )
        offsets.append(end)
        psw = torch.cat(weights) if weighted else None
        with torch.set_grad_enabled(grad):
            return self._tbe(torch.cat(indices), torch.cat(offsets), per_sample_weights=psw)

    def pooled(
        self, bags: Sequence[Bags], *, keep_for_backward: bool
    ) -> tuple[list[torch.Tensor], Any]:
        if not bags:
            return [], None
        out = self._run(bags, grad=keep_for_backward)
        pieces = [
            out[: b.num_bags, self._col_starts[i] : self._col_starts[i + 1]].detach()
            for i, b in enumerate(bags)
        ]
        return pieces, (out if keep_for_backward else None)

    def backward_pooled(
        self, handle: Any, bags: Sequence[Bags], grads: Sequence[torch.Tensor]
    ) -> None:
        if handle is None:
            return
        full = torch.zeros_like(handle)
        for i, g in enumerate(grads):
            full[: g.shape[0], self._col_starts[i] : self._col_starts[i + 1]] = g
        torch.autograd.backward(handle, full)

    def pooled_flat(self, bags: FlatBags, *, keep_for_backward: bool) -> tuple[torch.Tensor, Any]:
        """One kernel call: the bags are already in the kernel's layout."""
        assert self._tbe is not None
        with torch.set_grad_enabled(keep_for_backward):
            out = self._tbe(bags.indices, bags.offsets, per_sample_weights=bags.weights)
        return (out.detach(), out) if keep_for_backward else (out, None)

    def backward_flat(self, handle: Any, bags: FlatBags, grad: torch.Tensor) -> None:
        if handle is not None:
            torch.autograd.backward(handle, grad)

    def apply_flat(self, bags: FlatBags, grad: torch.Tensor) -> None:
        if self._tbe is None or bags.indices.numel() == 0:
            return
        _, handle = self.pooled_flat(bags, keep_for_backward=True)
        torch.autograd.backward(handle, grad)

    def gather(self, blocks: torch.Tensor, ids: torch.Tensor) -> torch.Tensor | None:
        """Rows read straight from the kernel's weights (blocks of one width, none cached:
        a cached kernel's rows may live in its HBM cache, which only its lookup reads)."""
        flat = self._flat_rows()
        if flat is None:
            return None
        starts = self._row_starts
        return flat.index_select(0, starts[blocks] + ids)

    def _flat_rows(self) -> torch.Tensor | None:
        """Every block's rows as one ``[sum(rows), width]`` view of the kernel's weights, or
        None (blocks of several widths, a cached kernel, or no blocks)."""
        if self._tbe is None or self._cached or len({w for _, w in self.shapes}) != 1:
            return None
        weights = self._tbe.weights_host if self.device.type == "cpu" else self._tbe.weights_dev
        if weights.numel() != sum(r * w for r, w in self.shapes):
            return None  # the rows live elsewhere (UVM): read them through the kernel
        return weights.view(-1, self.shapes[0][1])

    def apply_row_grads(
        self,
        rows: Sequence[torch.Tensor],
        grads: Sequence[torch.Tensor],
        row_sq_means: Sequence[torch.Tensor | None] | None = None,
    ) -> None:
        if self._tbe is None or all(r.numel() == 0 for r in rows):
            return
        if row_sq_means is not None:
            # The kernel adds the block's own mean(g**2); pre-add the difference so the
            # state ends at s + row_sq_mean (the state tensors are views into the kernel's).
            states = self._tbe.split_optimizer_states()
            for b, (r, g, m) in enumerate(zip(rows, grads, row_sq_means, strict=True)):
                if m is not None and r.numel():
                    states[b][0][r] += m - (g * g).mean(1)
        bags = [
            Bags(indices=r, offsets=torch.arange(r.numel() + 1, device=self.device)) for r in rows
        ]
        out = self._run(bags, grad=True)
        self.backward_pooled(out, bags, grads)

    def weights(self) -> list[torch.Tensor]:
        """The blocks' weights; a cached kernel first writes its dirty cache rows back to
        unified memory (``flush``), where the views point."""
        if self._tbe is None:
            return []
        if self._cached:
            self._tbe.flush()
        return [w.detach() for w in self._tbe.split_embedding_weights()]

    def load(self, weights: Sequence[torch.Tensor]) -> None:
        """Overwrite the weights; a cached kernel then empties its cache
        (``reset_cache_states``), whose rows would otherwise shadow the new ones."""
        with torch.no_grad():
            for w, src in zip(self.weights(), weights, strict=True):
                w.copy_(src)
        if self._cached and self._tbe is not None:
            self._tbe.reset_cache_states()

    def optimizer_state(self) -> list[torch.Tensor | None]:
        """The kernel's momentum per block (views into its buffers); None for SGD."""
        if self._tbe is None:
            return []
        states = self._tbe.split_optimizer_states()
        if not states:  # EXACT_SGD keeps no state
            return [None] * len(self.shapes)
        return [s[0].detach() for s in states]

    def load_optimizer_state(self, states: Sequence[torch.Tensor | None]) -> None:
        copy_optimizer_states(self.optimizer_state(), states)


_FBGEMM_OK: dict[str, bool] = {}

#: Ops fbgemm's CUDA caching path calls, registered for the CUDA dispatch key only by a
#: CUDA build (the CPU build, fbgemm-gpu-cpu, registers them for the CPU key only).
CUDA_OPS = ("fbgemm::lxu_cache_lookup", "fbgemm::new_unified_tensor")


def _probe(device: torch.device) -> bool:
    """Build a one-block store on ``device`` and pool one bag: whether it runs."""
    try:
        store = FbgemmStore(
            [(2, 4)], SparseOptimizer(kind=OptimizerKind.ROWWISE_ADAGRAD), device=device
        )
        store.pooled(
            [
                Bags(
                    indices=torch.tensor([1], device=device),
                    offsets=torch.tensor([0, 1], device=device),
                )
            ],
            keep_for_backward=False,
        )
    except Exception:
        return False
    return True


def fbgemm_available() -> bool:
    """Whether fbgemm's CPU table-batched kernels import and run here."""
    if "cpu" not in _FBGEMM_OK:
        _FBGEMM_OK["cpu"] = _probe(torch.device("cpu"))
    return _FBGEMM_OK["cpu"]


def fbgemm_cuda_ops_registered() -> bool:
    """Whether the installed fbgemm registers CUDA kernels for its caching ops
    (:data:`CUDA_OPS`); False without fbgemm or with its CPU build."""
    try:
        import fbgemm_gpu  # noqa: F401  (registers torch.ops.fbgemm)
    except Exception:
        return False
    try:
        return all(torch._C._dispatch_has_kernel_for_dispatch_key(op, "CUDA") for op in CUDA_OPS)
    except RuntimeError:  # an op this fbgemm does not define
        return False


def fbgemm_cuda_available(device: torch.device | str = "cuda") -> bool:
    """Whether fbgemm's CUDA table-batched kernels run on ``device``: CUDA is up, the
    installed fbgemm has CUDA kernels (:func:`fbgemm_cuda_ops_registered`) and a
    one-block store pools a bag there. Not yet run on a GPU."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    key = str(device)
    if key not in _FBGEMM_OK:
        _FBGEMM_OK[key] = fbgemm_cuda_ops_registered() and _probe(device)
    return _FBGEMM_OK[key]
