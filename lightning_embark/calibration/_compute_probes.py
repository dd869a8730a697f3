"""Compute probes: the engine's lookup store and a UB requester's own work at several
bag counts, hotness and row widths, the wire codecs, the engine itself on a tiny batch,
and a DP cluster's dense passes.

The lookup store is the engine's (:func:`~lightning_embark.engine.stores.make_store`:
fbgemm's TBE where it runs, else torch), so the fitted constants are those of the kernels
training runs.

Every probe takes the ``device`` it measures on (default the CPU, where nothing changes):
every tensor it makes names that device, the lookup store is the one the engine uses
there (:func:`~lightning_embark.calibration._device.probe_store`: the torch store on
CUDA), codecs run through the kernels' ops (Triton on CUDA tensors, the codecs'
reference on the CPU), and every clock read waits for the device
(:func:`~lightning_embark.calibration._device.timer`).
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable
from typing import Any

from lightning_embark.calibration._device import probe_store, timer
from lightning_embark.calibration._timing import slowest_median, timed


def measure_lookup(
    *,
    rows: int = 100_000,
    dim: int = 128,
    batch: int = 2048,
    hotness: int = 8,
    repeats: int = 5,
    store: str | None = None,
    seed: int = 0,
    device: Any = "cpu",
) -> dict:
    """Forward (gather and pool) and backward (gradient and update) time of the engine's
    store for one block: ``batch`` bags of ``hotness`` uniform random rows of ``rows`` of
    width ``dim`` (the record counts the distinct rows the backward updates).

    ``store`` None is the engine's store option on ``device`` (:func:`probe_store`); the
    record's ``kernel`` is the store class that ran."""
    import torch

    from lightning_embark.engine import OptimizerKind, SparseOptimizer
    from lightning_embark.engine.stores import Bags, make_store

    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed(seed)
    block = make_store(
        store or probe_store(device),
        [(rows, dim)],
        SparseOptimizer(kind=OptimizerKind.ROWWISE_ADAGRAD, lr=0.01),
        device=device,
    )
    indices = torch.randint(rows, (batch * hotness,), generator=gen, device=device)
    offsets = torch.arange(0, batch * hotness + 1, hotness, device=device)
    bags = [Bags(indices=indices, offsets=offsets)]
    grads = [torch.randn(batch, dim, generator=gen, device=device)]
    forward_s, backward_s = _forward_backward(
        lambda: block.pooled(bags, keep_for_backward=True)[1],
        lambda handle: block.backward_pooled(handle, bags, grads),
        repeats,
        timer(device),
    )
    return _pass_record(
        type(block).__name__,
        indices,
        rows=rows,
        dim=dim,
        batch=batch,
        forward_s=forward_s,
        backward_s=backward_s,
    )


def measure_unique_pooling(
    *,
    rows: int = 100_000,
    dim: int = 128,
    batch: int = 2048,
    hotness: int = 8,
    repeats: int = 5,
    seed: int = 0,
    device: Any = "cpu",
) -> dict:
    """Seconds of a UB requester's own work for one table, with the engine's functions
    (:mod:`lightning_embark.engine.clusters._unique`): forward de-duplicates the IDs and
    pools every bag from the unique rows, backward sums the pooled gradient per unique row. Same
    record as :func:`measure_lookup`, so :func:`fit_lookup` fits it."""
    import torch

    from lightning_embark.engine.clusters import dedupe, pool_unique, unique_row_grads

    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed(seed)
    indices = torch.randint(rows, (batch * hotness,), generator=gen, device=device)
    offsets = torch.arange(0, batch * hotness, hotness, device=device)
    bag_of = torch.arange(batch, device=device).repeat_interleave(hotness)
    weights = torch.ones(batch * hotness, device=device)
    grad = torch.randn(batch, dim, generator=gen, device=device)

    def forward() -> tuple[int, torch.Tensor]:
        unique, (inverse,) = dedupe([indices])
        pool_unique(inverse, torch.zeros(unique.numel(), dim, device=device), offsets, None)
        return unique.numel(), inverse

    forward_s, backward_s = _forward_backward(
        forward,
        lambda ctx: unique_row_grads(ctx[0], ctx[1], bag_of, weights, grad),
        repeats,
        timer(device),
    )
    return _pass_record(
        "unique-pool",
        indices,
        rows=rows,
        dim=dim,
        batch=batch,
        forward_s=forward_s,
        backward_s=backward_s,
    )


def _forward_backward(
    forward: Callable[[], Any],
    backward: Callable[[Any], Any],
    repeats: int,
    clock: Callable[[], float] = time.perf_counter,
) -> tuple[float, float]:
    """Median seconds of ``forward()`` and of ``backward(its result)`` over ``repeats``
    (one more call first, to warm up), read with ``clock`` (the device's, so that the
    forward's queued kernels are not counted in the backward)."""
    fwd, bwd = [], []
    for i in range(repeats + 1):
        start = clock()
        ctx = forward()
        mid = clock()
        backward(ctx)
        end = clock()
        if i:
            fwd.append(mid - start)
            bwd.append(end - mid)
    return statistics.median(fwd), statistics.median(bwd)


def _pass_record(
    kernel: str,
    indices: Any,
    *,
    rows: int,
    dim: int,
    batch: int,
    forward_s: float,
    backward_s: float,
) -> dict:
    """One point for :func:`~lightning_embark.calibration._fit.fit_lookup`."""
    return {
        "kernel": kernel,
        "rows": rows,
        "dim": dim,
        "bags": batch,
        "ids": indices.numel(),
        "unique_rows": int(indices.unique().numel()),
        "bytes_read": indices.numel() * dim * 4,
        "forward_s": forward_s,
        "backward_s": backward_s,
    }


def lookup_shapes(batch: int, dim: int, rows: int) -> list[tuple[int, int, int, int]]:
    """``(bags, hotness, width, rows)`` shapes that separate per-bag, per-ID, per-byte and
    per-distinct-row costs: hotness 64 on a table of ``rows`` repeats rows, and on a
    table of ``rows // 50`` nearly every ID repeats one."""
    narrow = max(4, dim // 8 // 4 * 4)
    tables = (rows, max(16, rows // 50))
    return [
        (b, h, w, n)
        for n in tables
        for b in (max(1, batch // 4), batch)
        for h in (1, 8, 64)
        for w in (narrow, dim)
    ]


def measure_codecs(
    *, rows: int = 8192, dim: int = 128, repeats: int = 5, seed: int = 0, device: Any = "cpu"
) -> dict:
    """Encode and decode seconds of every lossy codec for ``rows x dim`` fp32 values, through
    the kernels' ops as the engine calls them (:func:`~lightning_embark.kernels.encode_rows`:
    the Triton kernels on CUDA tensors, the codec's reference on the CPU)."""
    import torch

    from lightning_embark.kernels import decode_rows, encode_rows
    from lightning_embark.plan import Compression
    from lightning_embark.wire import codec_for

    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(rows, dim, generator=gen, device=device)
    clock = timer(device)
    out = {}
    for comp in Compression:
        if comp is Compression.FP32:
            continue
        codec = codec_for(comp, backward=False)
        payload, _ = encode_rows(x, codec)  # also the warm-up (Triton compiles here)
        decode_rows(payload, codec, dim)
        enc = [timed(functools.partial(encode_rows, x, codec), clock) for _ in range(repeats)]
        dec = [
            timed(functools.partial(decode_rows, payload, codec, dim), clock)
            for _ in range(repeats)
        ]
        out[comp.value] = {
            "encode_s": statistics.median(enc),
            "decode_s": statistics.median(dec),
            "fp32_bytes": rows * dim * 4,
        }
    return out


def measure_engine_pieces(
    *,
    ranks_per_host: int,
    tables: int = 8,
    batch: int = 16,
    dim: int = 32,
    hot: int = 512,
    repeats: int = 5,
    device: Any = "cpu",
) -> dict:
    """Per-piece and per-routed-ID overhead of the engine's exchanged clusters (all ranks
    call).

    Times a forward and backward of
    :class:`~lightning_embark.torchrec_modules.ShardedEmbeddingBagCollection`
    on a tiny batch (bytes negligible) for ``tables`` tables laid out table-wise, row-wise
    over every rank (``world`` times the pieces: one per block and requester), and
    table-wise with fp16 (a cast per piece) and with fp8 (a scaled codec per piece); then
    table-wise and row-wise again with ``hot`` IDs per bag, where both layouts look up,
    update and send the same IDs and only row-wise routes each ID to its row shard.
    Returns the times (slowest rank, median over repeats), the pieces per rank of each
    layout and the IDs each rank routes in the hot row-wise run. The engine runs on
    ``device`` with the store it uses there.
    """
    import torch
    import torch.distributed as dist
    from torchrec.modules.embedding_modules import EmbeddingBagCollection
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    from lightning_embark.engine import EngineConfig, SparseOptimizer
    from lightning_embark.plan import ClusterPlan, ClusterType, Compression, Plan, layouts
    from lightning_embark.spec import ModelSpec, TableSpec
    from lightning_embark.torchrec_modules import ShardedEmbeddingBagCollection

    world = dist.get_world_size()
    spec = ModelSpec(
        name="calibrate",
        tables=tuple(
            TableSpec(name=f"c{i}", num_embeddings=1000, embedding_dim=dim, pooling_factor=1.0)
            for i in range(tables)
        ),
    )
    names = [t.name for t in spec.tables]

    def plan(comp: Compression, row_wise: bool) -> Plan:
        cluster = ClusterPlan(
            name="rb", type=ClusterType.RB, forward_compression=comp, backward_compression=comp
        )
        lay = (
            [layouts.row_wise(n, "rb", range(world)) for n in names]
            if row_wise
            else [layouts.table_wise(n, "rb", i % world) for i, n in enumerate(names)]
        )
        return Plan(
            world_size=world, ranks_per_host=ranks_per_host, clusters=(cluster,), tables=tuple(lay)
        )

    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed(dist.get_rank())

    def batch_of(hotness: int) -> KeyedJaggedTensor:
        return KeyedJaggedTensor(
            keys=names,
            values=torch.randint(1000, (tables * batch * hotness,), generator=gen, device=device),
            lengths=torch.full((tables * batch,), hotness, dtype=torch.int64, device=device),
            stride=batch,
        )

    kjts = {1: batch_of(1), hot: batch_of(hot)}
    out: dict[str, Any] = {"tables": tables, "world": world}
    layouts_ = (
        ("table_wise", Compression.FP32, False, 1),
        ("row_wise", Compression.FP32, True, 1),
        ("table_wise_fp16", Compression.FP16, False, 1),
        ("table_wise_fp8", Compression.FP8, False, 1),
        ("table_wise_hot", Compression.FP32, False, hot),
        ("row_wise_hot", Compression.FP32, True, hot),
    )
    modules = {}
    for label, comp, row_wise, _ in layouts_:
        ebc = EmbeddingBagCollection(
            tables=spec.embedding_bag_configs(), device=torch.device("meta")
        )
        modules[label] = ShardedEmbeddingBagCollection.from_ebc(
            ebc,
            plan(comp, row_wise),
            sparse_optimizer=SparseOptimizer(lr=0.01),
            # A plain engine: the probe times each lookup and update in the step.
            config=EngineConfig(store=probe_store(device), pipeline=False, overlap=False),
            device=device,
        )
    clock = timer(device)
    times: dict[str, list[float]] = {label: [] for label in modules}
    for i in range(repeats + 2):  # layouts in turn, so load drifts hit all alike; 2 warm-up rounds
        for label, _, _, hotness in layouts_:
            dist.barrier()
            start = clock()
            modules[label](kjts[hotness]).values().sum().backward()
            if i >= 2:
                times[label].append(clock() - start)
    for label, values in times.items():
        out[label + "_s"] = slowest_median(values, device=device)
    # pieces per rank as the cost model counts them: (block, requester) pairs served plus requested
    out["pieces"] = {"table_wise": 2 * tables, "row_wise": 2 * tables * world}
    out["routed_ids"] = tables * batch * hot
    out["hot"] = hot
    return out


def measure_dp_dense(
    *, rows: int = 131_072, dim: int = 32, ids: int = 8192, repeats: int = 5, device: Any = "cpu"
) -> dict:
    """Seconds of a DP cluster's dense gradient passes over one ``rows x dim`` table
    (zero-fill, scatter-add, flatten, scan for touched rows), without the all-reduce."""
    import torch

    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed(0)
    idx = torch.randint(rows, (ids,), generator=gen, device=device)
    grads = torch.randn(ids, dim, generator=gen, device=device)
    clock = timer(device)

    def passes() -> None:
        dense = torch.zeros(rows, dim, device=device).index_add_(0, idx, grads)
        flat = torch.cat([dense.reshape(-1)])
        full = flat.reshape(rows, dim)
        full[full.ne(0).any(1).nonzero().flatten()]

    passes()
    return {
        "bytes": rows * dim * 4,
        "seconds": statistics.median(timed(passes, clock) for _ in range(repeats)),
    }


def measure_dense_matmul(
    *,
    rows: int = 2048,
    in_dim: int = 1024,
    out_dim: int = 256,
    repeats: int = 5,
    device: Any = "cpu",
) -> dict:
    """Seconds of a tower module's forward and backward on one rank: ``y = x W`` over
    ``rows`` samples, then ``dx`` and ``dW``: ``6 * rows * in_dim * out_dim`` FLOPs
    (fp32), in the threads the ranks train with. Run on every rank at once, so that
    ranks sharing cores see each other as they do in training."""
    import torch

    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(rows, in_dim, generator=gen, device=device)
    w = torch.randn(in_dim, out_dim, generator=gen, device=device)
    g = torch.randn(rows, out_dim, generator=gen, device=device)
    clock = timer(device)

    def passes() -> None:
        x @ w  # forward
        g @ w.T  # input gradient
        x.T @ g  # weight gradient

    passes()
    return {
        "flops": 6 * rows * in_dim * out_dim,
        "seconds": statistics.median(timed(passes, clock) for _ in range(repeats)),
    }
