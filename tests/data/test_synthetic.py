"""SyntheticDataset: determinism, the sharding rule, ID distributions, hotness, learnability."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from lightning_embark.data import SyntheticDataset
from lightning_embark.data._synthetic import zipf_ranks
from lightning_embark.errors import ConfigError
from lightning_embark.spec import IdDistribution, ModelSpec, TableSpec, load_spec


def _spec(
    *,
    rows: int = 1000,
    pooling: float = 2.0,
    tables: int = 3,
    dense: int = 13,
    kind: str = "uniform",
    alpha: float = 1.1,
) -> ModelSpec:
    return ModelSpec(
        name="test",
        tables=tuple(
            TableSpec(name=f"t{i}", num_embeddings=rows, embedding_dim=4, pooling_factor=pooling)
            for i in range(tables)
        ),
        num_dense_features=dense,
        id_distribution=IdDistribution(kind=kind, alpha=alpha),
    )


def _same(a, b) -> bool:
    return (
        torch.equal(a.dense_features, b.dense_features)
        and torch.equal(a.labels, b.labels)
        and torch.equal(a.sparse_features.values(), b.sparse_features.values())
        and torch.equal(a.sparse_features.lengths(), b.sparse_features.lengths())
    )


def test_layout_and_ranges() -> None:
    spec = load_spec("mlperf-dlrm-dcnv2")
    batch = SyntheticDataset(spec, batch_size=32, num_batches=1).batch(0)
    assert batch.dense_features.shape == (32, 13)
    assert batch.dense_features.dtype == torch.float32
    assert (batch.dense_features >= 0).all() and torch.isfinite(batch.dense_features).all()
    assert batch.labels.shape == (32,) and set(batch.labels.tolist()) <= {0.0, 1.0}
    assert batch.sparse_features.keys() == spec.feature_names
    for table, jagged in zip(spec.tables, batch.sparse_features.to_dict().values(), strict=False):
        assert (jagged.lengths() == round(table.pooling_factor)).all()
        values = jagged.values()
        assert values.dtype == torch.int64
        assert ((values >= 0) & (values < table.num_embeddings)).all()


def test_same_arguments_same_batches_and_seeds_differ() -> None:
    spec = _spec(kind="zipf")
    first = list(SyntheticDataset(spec, batch_size=16, num_batches=3, seed=7, hotness="poisson"))
    again = list(SyntheticDataset(spec, batch_size=16, num_batches=3, seed=7, hotness="poisson"))
    other = list(SyntheticDataset(spec, batch_size=16, num_batches=3, seed=8, hotness="poisson"))
    assert all(_same(a, b) for a, b in zip(first, again, strict=False))
    assert not any(_same(a, b) for a, b in zip(first, other, strict=False))
    assert not _same(first[0], first[1])


@pytest.mark.parametrize("hotness", ["fixed", "poisson"])
def test_rank_batches_are_slices_of_the_single_rank_stream(as_rows, hotness: str) -> None:
    spec = _spec(kind="zipf", pooling=3.0)
    world = 4
    single = SyntheticDataset(spec, batch_size=8 * world, num_batches=3, seed=3, hotness=hotness)
    ranks = [
        SyntheticDataset(
            spec, batch_size=8, num_batches=3, seed=3, rank=r, world_size=world, hotness=hotness
        )
        for r in range(world)
    ]
    for index, whole in enumerate(single):
        assert as_rows([r.batch(index) for r in ranks]) == as_rows([whole])
        assert _same(ranks[1].global_batch(index), whole)


def test_dataloader_iteration_and_length() -> None:
    dataset = SyntheticDataset(_spec(), batch_size=4, num_batches=5)
    loaded = list(DataLoader(dataset, batch_size=None))
    assert len(dataset) == len(loaded) == 5
    assert all(_same(a, dataset.batch(i)) for i, a in enumerate(loaded))
    endless = SyntheticDataset(_spec(), batch_size=4)
    assert len(list(itertools.islice(endless, 7))) == 7
    with pytest.raises(TypeError):
        len(endless)


def test_zipf_is_skewed_and_hot_ids_are_scattered() -> None:
    rows = 100_000
    counts = {}
    for kind in ("uniform", "zipf"):
        spec = _spec(rows=rows, pooling=1.0, tables=1, dense=0, kind=kind, alpha=1.2)
        ids = SyntheticDataset(spec, batch_size=20_000).batch(0).sparse_features.values()
        counts[kind] = np.bincount(ids.numpy(), minlength=rows)
    top_zipf = np.sort(counts["zipf"])[::-1]
    top_uniform = np.sort(counts["uniform"])[::-1]
    assert top_zipf[:10].sum() > 0.2 * 20_000
    assert top_uniform[:10].sum() < 0.01 * 20_000
    hottest = np.argsort(counts["zipf"])[::-1][:10]
    assert not set(hottest.tolist()) <= set(range(100)), "hot IDs must not sit at 0..k"
    assert np.ptp(hottest) > rows // 10


def test_zipf_sampling_is_fast_and_in_range_for_huge_tables() -> None:
    u = np.random.default_rng(0).random(1_000_000)
    for alpha in (0.5, 1.0, 1.05, 2.0):
        ranks = zipf_ranks(u, 40_000_000, alpha)
        assert ranks.min() >= 0 and ranks.max() < 40_000_000
    spec = _spec(rows=500_000_000, pooling=1.0, tables=1, kind="zipf")
    ids = SyntheticDataset(spec, batch_size=1000).batch(0).sparse_features.values()
    assert int(ids.min()) >= 0 and int(ids.max()) < 500_000_000


def test_poisson_hotness_mean_matches_pooling_factor() -> None:
    spec = ModelSpec(
        name="hot",
        tables=(
            TableSpec(name="one", num_embeddings=100, embedding_dim=4, pooling_factor=1.0),
            TableSpec(name="many", num_embeddings=100, embedding_dim=4, pooling_factor=20.0),
            TableSpec(name="frac", num_embeddings=100, embedding_dim=4, pooling_factor=2.5),
        ),
        num_dense_features=0,
    )
    sparse = SyntheticDataset(spec, batch_size=20_000, hotness="poisson").batch(0).sparse_features
    lengths = {k: v.lengths().double() for k, v in sparse.to_dict().items()}
    assert lengths["one"].mean().item() == pytest.approx(1.0, abs=0.05)
    assert lengths["many"].mean().item() == pytest.approx(20.0, abs=0.2)
    assert lengths["frac"].mean().item() == pytest.approx(2.5, abs=0.05)
    assert (lengths["one"] == 0).double().mean().item() == pytest.approx(np.exp(-1.0), abs=0.02)
    fixed = SyntheticDataset(spec, batch_size=10).batch(0).sparse_features
    assert fixed["frac"].lengths().tolist() == [3] * 10  # round(2.5) = 3, not banker's 2


def _auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """Mann-Whitney AUC (ties broken arbitrarily; scores are continuous here)."""
    order = torch.argsort(scores)
    ranks = torch.empty_like(scores)
    ranks[order] = torch.arange(1, len(scores) + 1, dtype=scores.dtype)
    positives = labels.sum()
    negatives = len(labels) - positives
    return float(
        (ranks[labels == 1].sum() - positives * (positives + 1) / 2) / (positives * negatives)
    )


@pytest.fixture
def one_thread():
    """Tiny ops run faster on one thread, and do not stall when other jobs share the CPU."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_labels_are_learnable_by_a_small_model(one_thread) -> None:
    spec = _spec(rows=200, pooling=2.0, tables=4, kind="zipf", alpha=0.8)
    data = SyntheticDataset(spec, batch_size=256, seed=11)
    torch.manual_seed(0)
    bags = torch.nn.ModuleList(
        torch.nn.EmbeddingBag(t.num_embeddings, 1, mode="sum", include_last_offset=True)
        for t in spec.tables
    )
    for bag in bags:
        torch.nn.init.zeros_(bag.weight)
    dense = torch.nn.Linear(spec.num_dense_features, 1)
    params = [*bags.parameters(), *dense.parameters()]
    optimizer = torch.optim.Adam(params, lr=0.05)

    def logits(batch) -> torch.Tensor:
        out = dense(batch.dense_features).squeeze(1)
        for bag, jagged in zip(bags, batch.sparse_features.to_dict().values(), strict=False):
            out = out + bag(jagged.values(), jagged.offsets()).squeeze(1)
        return out

    for index in range(300):
        batch = data.batch(index)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits(batch), batch.labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    held_out = data.examples(10_000_000, 10_000_000 + 8192)
    with torch.no_grad():
        auc = _auc(logits(held_out), held_out.labels)
    best = _auc(
        torch.from_numpy(data.teacher_probabilities(10_000_000, 10_000_000 + 8192)),
        held_out.labels,
    )
    assert auc > 0.65, f"AUC {auc:.3f} (teacher {best:.3f})"
    assert 0.2 < held_out.labels.mean().item() < 0.6


def test_teacher_ignores_rank_and_world_size() -> None:
    spec = _spec()
    a = SyntheticDataset(spec, batch_size=8, seed=5).teacher_probabilities(100, 200)
    b = SyntheticDataset(spec, batch_size=2, seed=5, rank=3, world_size=4).teacher_probabilities(
        100, 200
    )
    assert np.array_equal(a, b)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"batch_size": 0}, "batch_size"),
        ({"batch_size": 4, "rank": 1}, "rank"),
        ({"batch_size": 4, "num_batches": -1}, "num_batches"),
        ({"batch_size": 4, "hotness": "zipf"}, "hotness"),
    ],
)
def test_validation(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        SyntheticDataset(_spec(), **kwargs)


def test_no_dense_features_and_single_row_tables() -> None:
    spec = _spec(rows=1, dense=0, kind="zipf")
    batch = SyntheticDataset(spec, batch_size=5).batch(0)
    assert batch.dense_features.shape == (5, 0)
    assert batch.sparse_features.values().eq(0).all()


def test_dataloader_workers_keep_the_order() -> None:
    dataset = SyntheticDataset(_spec(), batch_size=4, num_batches=5, seed=2)
    loaded = list(DataLoader(dataset, batch_size=None, num_workers=2))
    assert len(loaded) == 5
    assert all(_same(a, dataset.batch(i)) for i, a in enumerate(loaded))


def test_first_batch_continues_the_same_stream() -> None:
    from lightning_embark.data import SyntheticDataset
    from lightning_embark.spec import load_spec

    spec = load_spec("demo-small")
    full = list(SyntheticDataset(spec, batch_size=4, num_batches=3, seed=5, rank=1, world_size=2))
    tail = list(
        SyntheticDataset(
            spec, batch_size=4, num_batches=1, seed=5, rank=1, world_size=2, first_batch=2
        )
    )
    assert torch.equal(full[2].labels, tail[0].labels)
    assert torch.equal(full[2].sparse_features.values(), tail[0].sparse_features.values())
