"""Device discipline: everything the engine makes lives where its data lives, never on
torch's default device.

On a GPU, a tensor made without naming its device (``torch.zeros(n)``,
``torch.tensor([...])``, ``torch.arange(...)``) lands on the CPU and breaks the step (or
an NCCL collective). These tests catch such a tensor without a GPU: every real tensor
(tables, batches, the engine itself) is on the CPU, and our calls run a second time with
``torch.set_default_device("meta")`` active. A tensor that our code makes without naming
its device then lands on ``meta``, where it holds no values: mixing it with CPU tensors,
sending it through gloo or reading it on the host raises, and a result left on ``meta``
fails the comparison. Each run is compared with the same run without the meta default,
bit for bit: the same arithmetic runs in the same order on the same CPU, and the default
device only decides where tensors that do not name theirs go.

Covered: the engine's construction, forward, backward and fused sparse-optimizer step
for RB and UB clusters flat and hierarchical (4 ranks as 2 hosts x 2, so the
hierarchical RB cluster reduces inside the host), each plan with a DP cluster beside
it; fp32, fp16, bf16, int8 and fp8 wires; replicated, column-split, hash- and
range-split tables (row-wise Adagrad syncs replicas and column shards); weighted
features; DCN towers on two hosts (the tower modules' gradients are compared too); the
exchanges themselves (counts swapped when not given, the differentiable compressed
exchange); the dense-gradient all-reduce; and checkpoint save and load (DCP included)
with hash-split tables, whose rows are swapped through ``all_to_all``. A batch on
another device than the engine's is refused by name.

The plain runs and the meta runs are two sets of gloo ranks, and the meta ranks first
empties every ``functools`` cache of the package: a cached tensor (the fp8 decode table,
a layout's index tables) is then made under the meta default, so one made without its
device is caught, and it cannot spoil the reference (meta tensors are quietly permissive:
``cpu += meta`` does nothing, so a poisoned cache shared by both runs would agree with
itself).

Where the meta default is not active, and why:

* Autograd's engine runs backward nodes without the caller's torch-function modes
  (``torch.set_default_device`` installs one, ``torch.utils._device.DeviceContext``), so
  a default set around ``.backward()`` does not reach our backward. The tests re-enter
  it (``with torch.device("meta")``, the same mode, scoped) inside
  ``EmbeddingEngine._run_backward``, which is the whole sharded backward including the
  optimizer update, and inside the compressed exchange's ``backward``.
* DDP's communication hook only hands the bucket to a worker thread, and torch-function
  modes are per thread: the tests call :func:`hierarchical_allreduce`, the hook's whole
  work, directly.
* The engines use ``store="auto"``: fbgemm's store for the blocks whose widths it runs
  (multiples of 4), the torch store for the rest, so both stores' buffers are covered.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from lightning_embark.engine import EmbeddingEngine, EngineConfig, FeatureBatch, jagged_by_key
from lightning_embark.engine._optimizer import OptimizerKind, SparseOptimizer
from lightning_embark.engine.stores import TorchStore, make_store
from lightning_embark.errors import ConfigError
from lightning_embark.exchange import (
    FlatAllToAll,
    HierarchicalAllToAll,
    exchange,
    over,
)
from lightning_embark.exchange._compressed import _Exchange
from lightning_embark.kernels import ExchangeLayout
from lightning_embark.plan import Compression
from lightning_embark.sharding._checkpoint import load_sharded, save_sharded
from lightning_embark.sharding._dense_allreduce import (
    dense_allreduce_state,
    hierarchical_allreduce,
    release_dense_state,
)
from lightning_embark.testing import Scenario, all_layouts_plan, random_batches, run_gloo_ranks
from lightning_embark.testing._tower_scenarios import towers_plan
from lightning_embark.torchrec_modules import ShardedEmbeddingBagCollection

WORLD, RANKS_PER_HOST = 4, 2
#: Samples per rank and step; at step 1 the last rank has none.
BATCH = 4
STEPS = 2


@dataclass(frozen=True, kw_only=True)
class Case:
    """One engine configuration: a scenario builder's arguments and the optimizer."""

    name: str
    cluster: str = "rb"
    forward: Compression = Compression.FP32
    backward: Compression = Compression.FP32
    hierarchical: bool = False
    weighted: bool = False
    towers: bool = False
    optimizer: OptimizerKind = OptimizerKind.ROWWISE_ADAGRAD

    def scenario(self) -> Scenario:
        if self.towers:
            return towers_plan(
                WORLD,
                RANKS_PER_HOST,
                module="dcn",
                output_dim=4,
                compression=self.forward,
                hierarchical=self.hierarchical,
            )
        return all_layouts_plan(
            WORLD,
            RANKS_PER_HOST,
            self.cluster,
            forward=self.forward,
            backward=self.backward,
            hierarchical=self.hierarchical,
            weighted=self.weighted,
        )


CASES = (
    Case(name="rb flat fp32"),
    Case(
        name="rb hierarchical fp16/int8",
        forward=Compression.FP16,
        backward=Compression.INT8,
        hierarchical=True,
    ),
    Case(
        name="ub flat int8/fp16 weighted adagrad",
        cluster="ub",
        forward=Compression.INT8,
        backward=Compression.FP16,
        weighted=True,
        optimizer=OptimizerKind.ADAGRAD,
    ),
    Case(
        name="ub hierarchical fp8/bf16",
        cluster="ub",
        forward=Compression.FP8,
        backward=Compression.BF16,
        hierarchical=True,
    ),
    Case(name="dcn towers int8", towers=True, forward=Compression.INT8, hierarchical=True),
)


@contextmanager
def meta_default(active: bool = True) -> Iterator[None]:
    """``torch.set_default_device("meta")`` around the block, and inside the backward of the
    sharded engine and of the compressed exchange (see the module docstring)."""
    if not active:
        yield
        return
    assert torch.get_default_device() == torch.device("cpu"), torch.get_default_device()
    run_backward = EmbeddingEngine._run_backward
    exchange_backward = _Exchange.backward

    def engine_backward(self: EmbeddingEngine, states: list[Any], grad: torch.Tensor) -> None:
        with torch.device("meta"):
            run_backward(self, states, grad)

    def compressed_backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        with torch.device("meta"):
            return exchange_backward(ctx, grad)

    EmbeddingEngine._run_backward = engine_backward  # type: ignore[method-assign]
    _Exchange.backward = staticmethod(compressed_backward)  # type: ignore[method-assign, assignment]
    torch.set_default_device("meta")
    try:
        yield
    finally:
        torch.set_default_device(None)
        EmbeddingEngine._run_backward = run_backward  # type: ignore[method-assign]
        _Exchange.backward = staticmethod(exchange_backward)  # type: ignore[method-assign, assignment]


def clear_package_caches() -> None:
    """Empty every ``functools`` cache of ``lightning_embark`` (module docstring)."""
    for name, module in list(sys.modules.items()):
        if name.startswith("lightning_embark"):
            for value in vars(module).values():
                ours = getattr(value, "__module__", None) == name
                if ours and callable(getattr(value, "cache_clear", None)):
                    value.cache_clear()


def compare_forks(fn: Any, *args: Any, out: Path) -> None:
    """``fn(rank, world, *args, meta=...)`` on ``WORLD`` gloo ranks, plain then with the meta
    default in fresh ranks; every rank's results of both runs must agree bit for bit."""
    run_gloo_ranks(_forked, WORLD, fn, args, out, False)
    run_gloo_ranks(_forked, WORLD, fn, args, out, True)


def _forked(rank: int, world: int, fn: Any, args: tuple, out: Path, meta: bool) -> None:
    saved = out / f"plain-{rank}.pt"
    if not meta:
        torch.save(fn(rank, world, *args, meta=False), saved)
        return
    clear_package_caches()
    actual = fn(rank, world, *args, meta=True)
    assert_same(actual, torch.load(saved, weights_only=False), f"rank {rank}")


def assert_same(actual: Any, expected: Any, what: str) -> None:
    """Equal bit for bit, both real CPU tensors (or equal nested dicts / lists / None of
    them)."""
    if isinstance(expected, dict):
        assert isinstance(actual, dict) and actual.keys() == expected.keys(), what
        for key, value in expected.items():
            assert_same(actual[key], value, f"{what}: {key}")
        return
    if isinstance(expected, (list, tuple)):
        assert isinstance(actual, (list, tuple)) and len(actual) == len(expected), what
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            assert_same(a, e, f"{what}[{i}]")
        return
    if expected is None:
        assert actual is None, f"{what}: expected None, got {type(actual)}"
        return
    assert actual.device == expected.device == torch.device("cpu"), (
        f"{what}: on {actual.device}, expected the CPU"
    )
    assert actual.dtype == expected.dtype and actual.shape == expected.shape, (
        f"{what}: {actual.dtype} {tuple(actual.shape)} vs {expected.dtype} {tuple(expected.shape)}"
    )
    assert torch.equal(actual, expected), f"{what}: values differ"


def _feature_batches(scenario: Scenario, rank: int, weighted: bool) -> list[dict[str, Any]]:
    out = []
    for step in range(STEPS):
        sizes = [BATCH] * WORLD
        if step == 1:
            sizes[-1] = 0  # a rank with no samples
        kjt = random_batches(scenario, sizes, seed=10 + step, weighted=weighted)[rank]
        out.append(
            {
                key: FeatureBatch(values=v, lengths=n, weights=w)
                for key, (v, n, w) in jagged_by_key(kjt).items()
            }
        )
    return out


def _run_engine(case: Case, rank: int, *, meta: bool) -> dict[str, Any]:
    """Construct, then ``STEPS`` lookups with backward (and the fused update); the outputs,
    the tower modules' gradients and every block's rows, weights and optimizer state."""
    scenario = case.scenario()
    batches = _feature_batches(scenario, rank, case.weighted)
    optimizer = SparseOptimizer(kind=case.optimizer, lr=0.05, eps=0.05)
    with meta_default(meta):
        torch.manual_seed(3)  # the tower modules' init (rank 0's is broadcast)
        engine = EmbeddingEngine(
            scenario.tables,
            scenario.plan,
            sparse_optimizer=optimizer,
            is_weighted=case.weighted,
            config=EngineConfig(store="auto", seed=5),
        )
    width = sum(engine.output_dims)
    outputs, grads = [], []
    for step, batch in enumerate(batches):
        size = next(iter(batch.values())).batch_size
        upstream = torch.randn(size, width, generator=torch.Generator().manual_seed(step))
        with meta_default(meta):
            out = engine.lookup(batch)
            (out * upstream).sum().backward()
        outputs.append(out.detach())
        grads.append([p.grad.clone() for p in engine.towers.parameters() if p.grad is not None])
        for p in engine.towers.parameters():
            p.grad = None
    with meta_default(meta):
        shards = engine.local_shards()
    return {
        "outputs": outputs,
        "tower module gradients": grads,
        "rows": [s.rows for s in shards],
        "weights": [s.weight.clone() for s in shards],
        "optimizer states": [
            s.optimizer_state.clone() if s.optimizer_state is not None else None for s in shards
        ],
    }


def _engine_cases(rank: int, world: int, *, meta: bool) -> dict[str, Any]:
    results = {case.name: _run_engine(case, rank, meta=meta) for case in CASES}
    towers = next(case for case in CASES if case.towers)
    assert any(results[towers.name]["tower module gradients"]), "no tower module trained"
    if meta:
        _device_checks(rank)
    return results


def _device_checks(rank: int) -> None:
    """The engine reports the device it was given (``from_ebc`` passes it on); a device
    torch cannot allocate on is refused at construction; a batch that is not on the
    engine's device is refused by name on every rank (one rank's IDs are on ``meta``; the
    others learn of it from the exchange's status)."""
    scenario = CASES[0].scenario()
    optimizer = SparseOptimizer()
    with pytest.raises(ConfigError, match="not a device"):
        EmbeddingEngine(scenario.tables, scenario.plan, sparse_optimizer=optimizer, device="gpu")
    ebc = EmbeddingBagCollection(tables=scenario.tables, device=torch.device("meta"))
    engine = ShardedEmbeddingBagCollection.from_ebc(
        ebc,
        scenario.plan,
        sparse_optimizer=optimizer,
        config=EngineConfig(store="auto"),
        device="cpu",
    )
    assert engine.device == torch.device("cpu")
    batch = _feature_batches(scenario, rank, weighted=False)[0]
    if rank == 1:
        batch = {
            key: FeatureBatch(values=b.values.to("meta"), lengths=b.lengths)
            for key, b in batch.items()
        }
    expected = "are on meta but the engine runs on cpu" if rank == 1 else "rejected their"
    with pytest.raises(ConfigError, match=expected):
        engine.lookup(batch)


@pytest.mark.multiprocess
def test_engine_makes_nothing_on_the_default_device(tmp_path: Path) -> None:
    compare_forks(_engine_cases, out=tmp_path)


def test_store_factory_puts_blocks_on_the_device() -> None:
    """``make_store`` hands its device to the torch store (the ``auto`` choice off the CPU)
    and refuses fbgemm there, whose store drives fbgemm's host kernels only."""
    optimizer = SparseOptimizer(kind=OptimizerKind.ROWWISE_ADAGRAD)
    store = make_store("auto", [(3, 4), (5, 8)], optimizer, device="meta")
    assert isinstance(store, TorchStore)
    assert [w.device.type for w in store.weights()] == ["meta", "meta"]
    assert [s.device.type for s in store.optimizer_state() if s is not None] == ["meta", "meta"]
    with pytest.raises(ConfigError, match="fbgemm's CPU"):
        make_store("fbgemm", [(3, 4)], optimizer, device="meta")


def _layouts() -> tuple[ExchangeLayout, ExchangeLayout]:
    """Rank ``p`` gets rows ``[2p, 2p + 2)`` of two column blocks; every source's two rows
    are summed into the receiver's ``[2, 8]`` (partial sums, as RB's row shards)."""
    send = ExchangeLayout.from_row_splits([2] * WORLD, [(0, 3), (3, 5)], num_cols=8)
    recv = ExchangeLayout(ranks=(send.ranks[0],) * WORLD, num_rows=2, num_cols=8)
    return send, recv


def _exchanges(rank: int, world: int, *, meta: bool) -> list[Any]:
    """Both all-to-alls with counts swapped (not given), the compressed exchange forward
    and backward, and the hierarchical dense all-reduce in fp32 and bf16."""
    generator = torch.Generator().manual_seed(rank)
    counts = [rank + p for p in range(WORLD)]
    rows = torch.randn(sum(counts), 3, generator=generator)
    x = torch.randn(2 * WORLD, 8, generator=generator, requires_grad=True)
    grad = torch.randn(1001, generator=generator)  # odd: the host's slices need padding
    upstream = torch.randn(2, 8, generator=generator)
    send, recv = _layouts()
    out: list[Any] = []
    with meta_default(meta):
        flat = FlatAllToAll()
        out += list(flat(rows, counts))
        out += list(HierarchicalAllToAll(RANKS_PER_HOST)(rows, counts))
        y = exchange(
            x,
            send=send,
            recv=recv,
            forward_codec="int8",
            backward_codec="fp16",
            transport=over(flat),
        )
        (y * upstream).sum().backward()
        out += [y.detach(), x.grad]
        for compression in (Compression.FP32, Compression.BF16):
            state = dense_allreduce_state(ranks_per_host=RANKS_PER_HOST, compression=compression)
            out.append(hierarchical_allreduce(grad, state))
            release_dense_state(state)
    return [torch.tensor(o) if isinstance(o, list) else o for o in out]


@pytest.mark.multiprocess
def test_exchanges_and_dense_allreduce_make_nothing_on_the_default_device(
    tmp_path: Path,
) -> None:
    compare_forks(_exchanges, out=tmp_path)


def _collection(scenario: Scenario, seed: int) -> ShardedEmbeddingBagCollection:
    return ShardedEmbeddingBagCollection(
        scenario.tables,
        scenario.plan,
        sparse_optimizer=SparseOptimizer(kind=OptimizerKind.ROWWISE_ADAGRAD, lr=0.05),
        config=EngineConfig(store="auto", seed=seed),
    )


def _blocks(module: ShardedEmbeddingBagCollection) -> list[Any]:
    shards = module.local_shards()
    return [[s.weight.clone() for s in shards], [s.optimizer_state.clone() for s in shards]]


def _checkpoints(rank: int, world: int, root: Path, *, meta: bool) -> list[Any]:
    """A trained collection saved, and loaded into another one: the blocks it loaded, which
    must also be the ones saved."""
    scenario = all_layouts_plan(WORLD, RANKS_PER_HOST, "rb")
    source = _collection(scenario, seed=1)
    kjt = random_batches(scenario, [BATCH] * WORLD, seed=3)[rank]
    source(kjt).values().sum().backward()  # optimizer state that is not all zero
    target = _collection(scenario, seed=2)
    path = root / ("meta" if meta else "plain")
    with meta_default(meta):
        save_sharded(path, {"state_dict": {}}, {"ebc": source})
        # Rank 0 writes meta.pt last, after DCP's collectives; Lightning's
        # Trainer.save_checkpoint waits at a barrier after saving, as here.
        dist.barrier()
        load_sharded(path, nn.Module(), {"ebc": target})
    loaded = _blocks(target)
    assert_same(loaded, _blocks(source), "loaded blocks")
    return loaded


@pytest.mark.multiprocess
def test_checkpoint_save_and_load_make_nothing_on_the_default_device(tmp_path: Path) -> None:
    compare_forks(_checkpoints, tmp_path, out=tmp_path)
