"""Measurements (probes) for :mod:`~lightning_embark.calibration._fit`; every rank calls them.

All-to-alls among the ranks of each host (intra-host links), among the ranks with the
same local rank on every host (inter-host links) and whole hierarchical exchanges over
the world, all groups at once so that ranks contend for links and cores as they do in an
exchange; a ring all-reduce over the world; the engine's lookup store
(:func:`~lightning_embark.engine.stores.make_store`: fbgemm's TBE where it runs, else
torch) and a UB requester's own work at several bag counts, hotness and row widths; the
engine's codecs; the engine itself on a tiny batch; a DP cluster's dense passes. A
collective's time is the slowest rank's, the median over repeats.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from lightning_embark.errors import ConfigError

#: Default per-peer message sizes in bytes: 4 KiB .. 4 MiB.
DEFAULT_SIZES = (4 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20)
MEASUREMENT_VERSION = 1


def _slowest_median(times: list[float], group: Any = None) -> float:
    """Median over repeats of the slowest rank's time (all ranks of ``group`` call)."""
    import torch
    import torch.distributed as dist

    t = torch.tensor(times, dtype=torch.float64)
    if dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return float(statistics.median(t.tolist()))


def time_repeats(
    fn: Callable[[], Any], *, repeats: int, warmup: int = 1, group: Any = None
) -> float:
    """Seconds of ``fn()``: median over ``repeats`` of the slowest rank (barrier before each)."""
    import torch.distributed as dist

    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if dist.is_initialized():
            dist.barrier(group=group)
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return _slowest_median(times, group)


def host_groups(world: int, ranks_per_host: int) -> tuple[list[list[int]], list[list[int]]]:
    """Rank lists: one per host (intra-host), one per local rank across hosts (inter-host)."""
    if ranks_per_host < 1 or world % ranks_per_host:
        raise ConfigError(f"ranks_per_host={ranks_per_host} must divide the world size {world}")
    hosts = world // ranks_per_host
    intra = [list(range(h * ranks_per_host, (h + 1) * ranks_per_host)) for h in range(hosts)]
    inter = [[h * ranks_per_host + j for h in range(hosts)] for j in range(ranks_per_host)]
    return intra, inter


def _alltoall_series(
    sizes: Sequence[int],
    groups: list[list[int]],
    *,
    repeats: int,
    progress: Callable[[str], None],
    label: str,
) -> dict | None:
    """Per-peer all-to-all times in the group (of ``groups``) this rank belongs to."""
    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    handles = [
        dist.new_group(ranks=g, backend="gloo") for g in groups
    ]  # every rank creates every group
    n = len(groups[0])
    if n < 2:
        return None
    mine = next(h for g, h in zip(groups, handles, strict=False) if rank in g)
    seconds = []
    for size in sizes:
        numel = max(1, size // 4)
        send = torch.ones(n * numel, dtype=torch.float32)
        recv = torch.empty_like(send)
        t = time_repeats(
            functools.partial(dist.all_to_all_single, recv, send, group=mine), repeats=repeats
        )
        seconds.append(t / (n - 1))
        progress(
            f"{label} all-to-all, {len(groups)} group(s) of {n}: {_size(size)} per peer "
            f"{1e3 * t:.2f} ms ({numel * 4 / (t / (n - 1)) / 1e6:.1f} MB/s per rank)"
        )
    return {
        "sizes": [max(1, s // 4) * 4 for s in sizes],
        "seconds_per_peer": seconds,
        "group_size": n,
        "groups": len(groups),
    }


def hierarchical_series(
    sizes: Sequence[int], ranks_per_host: int, *, repeats: int, progress: Callable[[str], None]
) -> dict | None:
    """Whole hierarchical exchanges over the world, ``size`` bytes to every peer (counts
    known, as for the engine's row payloads); None on one host or one rank per host."""
    import torch
    import torch.distributed as dist

    from lightning_embark.exchange import HierarchicalAllToAll

    world = dist.get_world_size()
    if ranks_per_host < 2 or world <= ranks_per_host:
        return None
    exchange = HierarchicalAllToAll(ranks_per_host)  # every rank creates the same groups
    seconds = []
    for size in sizes:
        numel = max(1, size // 4)
        send = torch.ones(world * numel, 1, dtype=torch.float32)
        counts = [numel] * world
        t = time_repeats(functools.partial(exchange, send, counts, counts), repeats=repeats)
        seconds.append(t)
        progress(
            f"hierarchical all-to-all over {world} ranks: {_size(size)} per peer {1e3 * t:.2f} ms"
        )
    return {
        "sizes": [max(1, s // 4) * 4 for s in sizes],
        "seconds": seconds,
        "world": world,
        "ranks_per_host": ranks_per_host,
    }


def _allreduce_series(
    sizes: Sequence[int], *, repeats: int, progress: Callable[[str], None]
) -> dict | None:
    import torch
    import torch.distributed as dist

    world = dist.get_world_size()
    if world < 2:
        return None
    seconds = []
    for size in sizes:
        x = torch.ones(max(1, size // 4), dtype=torch.float32)
        t = time_repeats(functools.partial(dist.all_reduce, x), repeats=repeats)
        seconds.append(t)
        progress(f"all-reduce over {world} ranks: {_size(size)} {1e3 * t:.2f} ms")
    return {"sizes": [max(1, s // 4) * 4 for s in sizes], "seconds": seconds, "world": world}


def measure_lookup(
    *,
    rows: int = 100_000,
    dim: int = 128,
    batch: int = 2048,
    hotness: int = 8,
    repeats: int = 5,
    kernel: str = "auto",
    seed: int = 0,
) -> dict:
    """Forward (gather and pool) and backward (gradient and update) time of the engine's
    store for one block: ``batch`` bags of ``hotness`` uniform random rows of ``rows`` of
    width ``dim`` (the record counts the distinct rows the backward updates)."""
    import torch

    from lightning_embark.engine import OptimizerKind, SparseOptimizer
    from lightning_embark.engine.stores import Bags, make_store

    gen = torch.Generator().manual_seed(seed)
    store = make_store(
        kernel, [(rows, dim)], SparseOptimizer(kind=OptimizerKind.ROWWISE_ADAGRAD, lr=0.01)
    )
    indices = torch.randint(rows, (batch * hotness,), generator=gen)
    bags = [Bags(indices=indices, offsets=torch.arange(0, batch * hotness + 1, hotness))]
    grads = [torch.randn(batch, dim, generator=gen)]
    forward_s, backward_s = _forward_backward(
        lambda: store.pooled(bags, keep_for_backward=True)[1],
        lambda handle: store.backward_pooled(handle, bags, grads),
        repeats,
    )
    return _pass_record(
        type(store).__name__,
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
) -> dict:
    """Seconds of a UB requester's own work for one table, with the engine's functions
    (:mod:`lightning_embark.engine.clusters._ub`): forward de-duplicates the IDs and pools every
    bag from the unique rows, backward sums the pooled gradient per unique row. Same
    record as :func:`measure_lookup`, so :func:`fit_lookup` fits it."""
    import torch

    from lightning_embark.engine.clusters import dedupe, pool_unique, unique_row_grads

    gen = torch.Generator().manual_seed(seed)
    indices = torch.randint(rows, (batch * hotness,), generator=gen)
    offsets = torch.arange(0, batch * hotness, hotness)
    bag_of = torch.arange(batch).repeat_interleave(hotness)
    weights = torch.ones(batch * hotness)
    grad = torch.randn(batch, dim, generator=gen)

    def forward() -> tuple[int, torch.Tensor]:
        unique, (inverse,) = dedupe([indices])
        pool_unique(inverse, torch.zeros(unique.numel(), dim), offsets, None)
        return unique.numel(), inverse

    forward_s, backward_s = _forward_backward(
        forward, lambda ctx: unique_row_grads(ctx[0], ctx[1], bag_of, weights, grad), repeats
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
    forward: Callable[[], Any], backward: Callable[[Any], Any], repeats: int
) -> tuple[float, float]:
    """Median seconds of ``forward()`` and of ``backward(its result)`` over ``repeats``
    (one more call first, to warm up)."""
    fwd, bwd = [], []
    for i in range(repeats + 1):
        start = time.perf_counter()
        ctx = forward()
        mid = time.perf_counter()
        backward(ctx)
        end = time.perf_counter()
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


def measure_codecs(*, rows: int = 8192, dim: int = 128, repeats: int = 5, seed: int = 0) -> dict:
    """Encode and decode seconds of every lossy codec for ``rows x dim`` fp32 values."""
    import torch

    from lightning_embark.plan import Compression
    from lightning_embark.wire import codec_for

    x = torch.randn(rows, dim, generator=torch.Generator().manual_seed(seed))
    out = {}
    for comp in Compression:
        if comp is Compression.FP32:
            continue
        codec = codec_for(comp, backward=False)
        payload = codec.encode(x).payload
        enc = [_timed(functools.partial(codec.encode, x)) for _ in range(repeats)]
        dec = [_timed(functools.partial(codec.decode, payload, dim)) for _ in range(repeats)]
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
) -> dict:
    """Per-piece and per-routed-ID CPU overhead of the engine's exchanged clusters (all ranks
    call).

    Times a forward and backward of
    :class:`~lightning_embark.engine._sharded.ShardedEmbeddingBagCollection`
    on a tiny batch (bytes negligible) for ``tables`` tables laid out table-wise, row-wise
    over every rank (``world`` times the pieces: one per block and requester), and
    table-wise with fp16 (a cast per piece) and with fp8 (a scaled codec per piece); then
    table-wise and row-wise again with ``hot`` IDs per bag, where both layouts look up,
    update and send the same IDs and only row-wise routes each ID to its row shard.
    Returns the times (slowest rank, median over repeats), the pieces per rank of each
    layout and the IDs each rank routes in the hot row-wise run.
    """
    import torch
    import torch.distributed as dist
    from torchrec.modules.embedding_modules import EmbeddingBagCollection
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    from lightning_embark.engine import ShardedEmbeddingBagCollection, SparseOptimizer
    from lightning_embark.plan import ClusterPlan, ClusterType, Compression, Plan, layouts
    from lightning_embark.spec import ModelSpec, TableSpec

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

    gen = torch.Generator().manual_seed(dist.get_rank())

    def batch_of(hotness: int) -> KeyedJaggedTensor:
        return KeyedJaggedTensor(
            keys=names,
            values=torch.randint(1000, (tables * batch * hotness,), generator=gen),
            lengths=torch.full((tables * batch,), hotness, dtype=torch.int64),
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
            ebc, plan(comp, row_wise), sparse_optimizer=SparseOptimizer(lr=0.01)
        )
    times: dict[str, list[float]] = {label: [] for label in modules}
    for i in range(repeats + 2):  # layouts in turn, so load drifts hit all alike; 2 warm-up rounds
        for label, _, _, hotness in layouts_:
            dist.barrier()
            start = time.perf_counter()
            modules[label](kjts[hotness]).values().sum().backward()
            if i >= 2:
                times[label].append(time.perf_counter() - start)
    for label, values in times.items():
        out[label + "_s"] = _slowest_median(values)
    # pieces per rank as the cost model counts them: (block, requester) pairs served plus requested
    out["pieces"] = {"table_wise": 2 * tables, "row_wise": 2 * tables * world}
    out["routed_ids"] = tables * batch * hot
    out["hot"] = hot
    return out


def measure_dp_dense(
    *, rows: int = 131_072, dim: int = 32, ids: int = 8192, repeats: int = 5
) -> dict:
    """Seconds of a DP cluster's dense gradient passes over one ``rows x dim`` table
    (zero-fill, scatter-add, flatten, scan for touched rows), without the all-reduce."""
    import torch

    gen = torch.Generator().manual_seed(0)
    idx = torch.randint(rows, (ids,), generator=gen)
    grads = torch.randn(ids, dim, generator=gen)

    def passes() -> None:
        dense = torch.zeros(rows, dim).index_add_(0, idx, grads)
        flat = torch.cat([dense.reshape(-1)])
        full = flat.reshape(rows, dim)
        full[full.ne(0).any(1).nonzero().flatten()]

    passes()
    return {
        "bytes": rows * dim * 4,
        "seconds": statistics.median(_timed(passes) for _ in range(repeats)),
    }


def _timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _size(n: float) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n:g} B"


def measure_all(
    *,
    sizes: Sequence[int] = DEFAULT_SIZES,
    ranks_per_host: int,
    repeats: int = 5,
    lookup_rows: int = 100_000,
    lookup_batch: int = 2048,
    dim: int = 128,
    progress: Callable[[str], None] | None = None,
) -> dict:
    """Every measurement of a calibration; all ranks of the default group call this.

    Returns the same dict on every rank (collective times are the slowest rank's;
    lookup and codec times the median rank's, measured on all ranks at once so they
    share the cores as a training step does).
    """
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        raise ConfigError(
            "measure_all runs inside a process group; launch it with torchrun or run_gloo_ranks"
        )
    rank, world = dist.get_rank(), dist.get_world_size()
    say = progress if (progress is not None and rank == 0) else (lambda _msg: None)
    intra_groups, inter_groups = host_groups(world, ranks_per_host)
    sizes = sorted({int(s) for s in sizes})
    if len(sizes) < 2 or sizes[0] < 4:
        raise ConfigError(f"--sizes needs at least two distinct sizes >= 4 bytes, got {sizes}")
    result: dict[str, Any] = {
        "version": MEASUREMENT_VERSION,
        "backend": dist.get_backend(),
        "world": world,
        "ranks_per_host": ranks_per_host,
        "num_hosts": world // ranks_per_host,
        "repeats": repeats,
    }
    result["alltoall_intra"] = _alltoall_series(
        sizes, intra_groups, repeats=repeats, progress=say, label="intra-host"
    )
    result["alltoall_inter"] = _alltoall_series(
        sizes, inter_groups, repeats=repeats, progress=say, label="inter-host"
    )
    result["allreduce"] = _allreduce_series(sizes, repeats=repeats, progress=say)
    result["alltoall_hierarchical"] = hierarchical_series(
        sizes, ranks_per_host, repeats=repeats, progress=say
    )
    tiny = torch.ones(world, dtype=torch.float32)
    tiny_out = torch.empty_like(tiny)
    result["world_alltoall_tiny_s"] = time_repeats(
        lambda: dist.all_to_all_single(tiny_out, tiny), repeats=max(repeats, 10)
    )
    say(f"world all-to-all of 4 B per peer: {1e3 * result['world_alltoall_tiny_s']:.3f} ms")
    dist.barrier()
    shapes = lookup_shapes(lookup_batch, dim, lookup_rows)
    lookups = [
        measure_lookup(rows=n, dim=w, batch=b, hotness=h, repeats=repeats, seed=rank)
        for b, h, w, n in shapes
    ]
    unique_pooling = [
        measure_unique_pooling(rows=n, dim=w, batch=b, hotness=h, repeats=repeats, seed=rank)
        for b, h, w, n in shapes
    ]
    codecs = measure_codecs(dim=dim, repeats=repeats, seed=rank)
    dense = measure_dp_dense(repeats=repeats)
    gathered: list[Any] = [None] * world
    dist.all_gather_object(
        gathered,
        {
            "lookups": lookups,
            "unique_pooling": unique_pooling,
            "codecs": codecs,
            "dp_dense": dense,
        },
    )
    result["dp_dense"] = dict(
        dense, seconds=statistics.median(g["dp_dense"]["seconds"] for g in gathered)
    )
    say(
        f"DP dense gradient passes over {_size(dense['bytes'])}: "
        f"{1e3 * result['dp_dense']['seconds']:.2f} ms"
    )
    for key, points in (("lookups", lookups), ("unique_pooling", unique_pooling)):
        result[key] = [
            dict(
                entry,
                forward_s=statistics.median(g[key][i]["forward_s"] for g in gathered),
                backward_s=statistics.median(g[key][i]["backward_s"] for g in gathered),
            )
            for i, entry in enumerate(points)
        ]
    result["codecs"] = {
        name: {
            key: (
                statistics.median(g["codecs"][name][key] for g in gathered)
                if key.endswith("_s")
                else value
            )
            for key, value in entry.items()
        }
        for name, entry in codecs.items()
    }
    result["engine"] = measure_engine_pieces(
        ranks_per_host=ranks_per_host, tables=16, repeats=max(3 * repeats, 6)
    )
    eng = result["engine"]
    say(
        f"engine, {eng['tables']} tables x 16 samples: table-wise {1e3 * eng['table_wise_s']:.2f} "
        "ms, row-wise "
        f"{1e3 * eng['row_wise_s']:.2f} ms, table-wise fp16 {1e3 * eng['table_wise_fp16_s']:.2f} "
        "ms, "
        f"fp8 {1e3 * eng['table_wise_fp8_s']:.2f} ms; {eng['hot']} IDs per bag: "
        f"table-wise {1e3 * eng['table_wise_hot_s']:.2f} ms, row-wise "
        f"{1e3 * eng['row_wise_hot_s']:.2f} ms"
    )
    for lk in result["lookups"]:
        say(
            f"lookup ({lk['kernel']}, {lk['bags']} bags x {lk['ids'] // lk['bags']} ids x "
            f"{lk['dim']}, "
            f"{lk['unique_rows']} of {lk['rows']} rows updated): "
            f"forward {1e3 * lk['forward_s']:.2f} ms, backward {1e3 * lk['backward_s']:.2f} ms"
        )
    for name, entry in result["codecs"].items():
        say(
            f"codec {name}: encode {entry['fp32_bytes'] / entry['encode_s'] / 1e9:.2f} GB/s, "
            f"decode {entry['fp32_bytes'] / entry['decode_s'] / 1e9:.2f} GB/s (fp32 bytes)"
        )
    return result
