"""The tower partitioner: constraints always hold, planted groups are found, zero
affinity gives the balanced (LPT) partition, the search stops at a local optimum, and
the affinity type refuses what is not an affinity.

The checks are exact (integers and comparisons of sums of the same float terms), so no
tolerance other than the ``1e-9`` relative slack of the cap comparison is needed.
"""

from __future__ import annotations

import collections
import functools
import itertools
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lightning_embark.errors import ConfigError
from lightning_embark.planner import (
    CostModel,
    FeatureAffinity,
    calibration_for_topology,
    kept_affinity,
    partition_by_affinity,
    partition_tables,
    table_costs,
)
from lightning_embark.spec import load_spec
from lightning_embark.topology import topology_preset


def _model(spec: str = "demo-small", hosts: int = 2, local: int = 4) -> CostModel:
    topology = topology_preset("dgx-h100", num_hosts=hosts, ranks_per_host=local)
    return CostModel(
        load_spec(spec),
        calibration_for_topology(topology),
        num_hosts=hosts,
        ranks_per_host=local,
        batch_size=1024,
    )


def _score(a: np.ndarray, groups: list[list[int]]) -> float:
    return sum(a[i, j] for g in groups for i, j in itertools.combinations(g, 2))


def _lpt(costs: np.ndarray, count: int) -> list[list[int]]:
    """Longest processing time first, written out independently of the module."""
    load = [0.0] * count
    groups: list[list[int]] = [[] for _ in range(count)]
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        t = min(range(count), key=lambda t: (load[t], t))
        groups[t].append(i)
        load[t] += costs[i]
    return sorted((sorted(g) for g in groups if g), key=lambda g: g[0])


def _random_affinity(rng: np.random.Generator, n: int) -> np.ndarray:
    a = rng.exponential(size=(n, n))
    a = a + a.T
    np.fill_diagonal(a, 0.0)
    return a


def test_planted_groups_are_recovered_for_every_seed() -> None:
    rng = np.random.default_rng(0)
    truth = [[0, 4, 8, 11], [1, 5, 6, 9], [2, 3, 7, 10]]
    a = 0.01 * _random_affinity(rng, 12)
    for group in truth:
        for i, j in itertools.combinations(group, 2):
            a[i, j] = a[j, i] = 1.0 + rng.random()
    for seed in range(4):
        assert partition_by_affinity(a, np.ones(12), 3, seed=seed) == truth


def test_random_instances_keep_every_constraint_and_beat_the_balanced_start() -> None:
    rng = np.random.default_rng(1)
    for _ in range(40):
        n = int(rng.integers(2, 30))
        count = int(rng.integers(1, 7))
        balance = float(rng.uniform(1.0, 2.0))
        costs = rng.uniform(0.1, 3.0, size=n)
        sizes = rng.uniform(1.0, 5.0, size=n)
        k = min(count, n)
        capacity = float(sizes.sum())  # never binding for LPT's start
        a = _random_affinity(rng, n)
        groups = partition_by_affinity(
            a, costs, count, balance=balance, sizes=sizes, capacity=capacity, seed=3
        )
        assert sorted(i for g in groups for i in g) == list(range(n))
        assert len(groups) == k and all(groups)
        bound = max(balance * costs.sum() / k, costs.max())
        lpt = _lpt(costs, k)
        lpt_max = max(costs[g].sum() for g in lpt)
        # Feasible moves never break the cap; a start over it (LPT can exceed a tight
        # cap) is never made worse.
        assert max(costs[g].sum() for g in groups) <= max(bound, lpt_max) * (1 + 1e-9)
        assert _score(a, groups) >= _score(a, lpt) * (1 - 1e-12)


def test_zero_affinity_is_exactly_the_balanced_partition() -> None:
    rng = np.random.default_rng(2)
    for count in (1, 2, 3, 5):
        costs = rng.uniform(0.5, 2.0, size=17)
        got = partition_by_affinity(np.zeros((17, 17)), costs, count, seed=9)
        assert got == _lpt(costs, count)


def test_no_single_move_improves_the_result() -> None:
    """The search stops only at a local optimum of moves (swaps are checked by the
    planted test: a move-only search gets stuck where swaps are needed)."""
    rng = np.random.default_rng(3)
    n, count, balance = 14, 3, 1.3
    costs = rng.uniform(0.5, 1.5, size=n)
    a = _random_affinity(rng, n)
    groups = partition_by_affinity(a, costs, count, balance=balance, seed=0)
    bound = max(balance * costs.sum() / count, costs.max())
    where = {i: t for t, g in enumerate(groups) for i in g}
    for i in range(n):
        source = where[i]
        if len(groups[source]) == 1:
            continue
        for target, members in enumerate(groups):
            if target == source or costs[members].sum() + costs[i] > bound:
                continue
            gain = a[i, members].sum() - a[i, [j for j in groups[source] if j != i]].sum()
            assert gain <= 1e-9 * a.sum()


def test_the_same_seed_gives_the_same_towers_and_results_do_not_depend_on_call_order() -> None:
    rng = np.random.default_rng(4)
    a = _random_affinity(rng, 20)
    costs = rng.uniform(0.5, 1.5, size=20)
    first = partition_by_affinity(a, costs, 4, seed=7)
    partition_by_affinity(a, costs, 4, seed=8)
    assert partition_by_affinity(a, costs, 4, seed=7) == first


def test_memory_capacity_is_respected() -> None:
    a = np.ones((6, 6)) - np.eye(6)  # everything wants one tower
    sizes = np.array([3.0, 3.0, 3.0, 1.0, 1.0, 1.0])
    groups = partition_by_affinity(a, np.ones(6), 2, balance=3.0, sizes=sizes, capacity=7.0)
    assert all(sizes[g].sum() <= 7.0 for g in groups)


def test_options_out_of_range_are_refused() -> None:
    a, c = np.zeros((3, 3)), np.ones(3)
    with pytest.raises(ConfigError, match="positive integer, got 0"):
        partition_by_affinity(a, c, 0)
    with pytest.raises(ConfigError, match="at least 1"):
        partition_by_affinity(a, c, 2, balance=0.9)


def test_the_statistics_only_partitioner_balances_cost_and_is_deterministic() -> None:
    model = _model(spec="mlperf-dlrm-dcnv2")
    first = partition_tables(model, 4)
    assert first == partition_tables(model, 4)
    costs = table_costs(model, [t.name for t in model.spec.tables])
    loads = [sum(costs[n] for n in r.tables) for r in first]
    # List scheduling: the fullest tower exceeds the mean by at most the largest table.
    assert max(loads) <= sum(loads) / len(loads) + max(costs.values()) + 1e-12
    assert sorted(n for r in first for n in r.tables) == sorted(costs)


def test_partition_tables_follows_the_affinity_within_the_cap() -> None:
    model = _model()
    names = [t.name for t in model.spec.tables]
    half = len(names) // 2
    odd, even = names[1::2], names[0::2]
    matrix = np.zeros((len(names), len(names)))
    for group in (odd, even):
        for x, y in itertools.combinations(group, 2):
            i, j = names.index(x), names.index(y)
            matrix[i, j] = matrix[j, i] = 1.0
    affinity = FeatureAffinity(features=tuple(names), matrix=matrix)
    towers = partition_tables(model, 2, affinity=affinity, balance=4.0)
    assert sorted(sorted(t.tables) for t in towers) == sorted([sorted(odd), sorted(even)])
    assert half >= 1
    kept = kept_affinity(matrix, [[names.index(n) for n in t.tables] for t in towers])
    assert kept == 1.0


def test_feature_affinity_checks_round_trips_and_restricts(tmp_path: Path) -> None:
    m = np.array([[0.0, 2.0, 1.0], [2.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    affinity = FeatureAffinity(features=("a", "b", "c"), matrix=m, source="test")
    path = tmp_path / "affinity.json"
    affinity.save(path)
    again = FeatureAffinity.load(path)
    assert again.features == ("a", "b", "c") and np.array_equal(again.matrix, m)
    assert np.array_equal(affinity.over(["c", "a", "zz"]), [[0, 1, 0], [1, 0, 0], [0, 0, 0]])
    with pytest.raises(ConfigError, match="not symmetric"):
        FeatureAffinity(features=("a", "b"), matrix=np.array([[0.0, 1.0], [0.0, 0.0]]))
    with pytest.raises(ConfigError, match="non-negative"):
        FeatureAffinity(features=("a", "b"), matrix=-np.ones((2, 2)))
    with pytest.raises(ConfigError, match=r"shape \(2, 2\) for 3 features"):
        FeatureAffinity(features=("a", "b", "c"), matrix=np.zeros((2, 2)))
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"bad\.json"):
        FeatureAffinity.load(tmp_path / "bad.json")
    assert kept_affinity(m, [[0, 1], [2]]) == pytest.approx(2.0 / 3.0)
    assert kept_affinity(np.zeros((2, 2)), [[0], [1]]) == 1.0


def _pairs(counts: Iterable[int]) -> int:
    return sum(c * (c - 1) // 2 for c in counts)


def _ari(truth: Sequence[int], found: Sequence[int]) -> float:
    """Adjusted Rand index of two labelings (Hubert and Arabie): pair agreement above the
    agreement expected of two random labelings with the same group sizes; 1 is identical."""
    both = _pairs(collections.Counter(zip(truth, found, strict=True)).values())
    a = _pairs(collections.Counter(truth).values())
    b = _pairs(collections.Counter(found).values())
    expected = a * b / _pairs([len(truth)])
    return (both - expected) / ((a + b) / 2 - expected)


@functools.cache
def _random_scores(groups: tuple[int, ...], sizes: tuple[int, ...]) -> tuple[float, ...]:
    """The ARI against a labeling with groups of ``groups`` sizes of every assignment of
    the items to towers of ``sizes`` (34,650 of them for 12 items in three towers of four).
    By symmetry it does not matter which items form which group."""
    truth = [g for g, size in enumerate(groups) for _ in range(size)]
    out: list[float] = []

    def assign(left: list[int], towers: tuple[int, ...], labels: list[int]) -> None:
        if not towers:
            out.append(_ari(truth, labels))
            return
        for chosen in itertools.combinations(left, towers[0]):
            mine = labels.copy()
            for i in chosen:
                mine[i] = len(sizes) - len(towers)
            assign([i for i in left if i not in chosen], towers[1:], mine)

    assign(list(range(len(truth))), sizes, [0] * len(truth))
    return tuple(out)


def _chance_of_at_least(score: float, truth: Sequence[int], sizes: Sequence[int]) -> float:
    """The exact probability that a uniformly random partition into towers of ``sizes``
    reaches an ARI of at least ``score`` against ``truth``."""
    groups = tuple(collections.Counter(truth)[g] for g in sorted(set(truth)))
    scores = _random_scores(groups, tuple(sizes))
    return sum(s >= score - 1e-12 for s in scores) / len(scores)


def _planted_towers(
    names: list[str], groups: list[list[str]], seed: int
) -> tuple[list[list[str]], list[list[str]]]:
    """Train a flat DLRM briefly on clicks that depend only on ``groups``' pairs, read its
    affinity, and partition its tables into as many towers: the learned towers and the
    statistics-only ones (no affinity)."""
    import torch

    from lightning_embark.data import ctr_spec

    spec = ctr_spec(dict.fromkeys(names, 16), num_dense_features=0, embedding_dim=8)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a small model: one thread is faster than a team on 2 cores
    try:
        return _train_and_partition(spec, groups, seed)
    finally:
        torch.set_num_threads(threads)


def _train_and_partition(
    spec: Any, groups: list[list[str]], seed: int
) -> tuple[list[list[str]], list[list[str]]]:
    import torch

    from lightning_embark.data import InteractionDataset
    from lightning_embark.models import DLRMModule
    from lightning_embark.planner import load_calibration, measure_affinity

    data = InteractionDataset(spec, groups, batch_size=256, num_batches=250, seed=seed)
    torch.manual_seed(seed)
    model = DLRMModule(
        spec,
        dense_arch_layer_sizes=[8],
        over_arch_layer_sizes=[32, 1],
        dense_lr=0.05,
        sparse_lr=0.1,
    )
    model.materialize_embeddings()
    optimizer = model.configure_optimizers()
    for batch in data:
        loss, _ = model.batch_loss(batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    affinity = measure_affinity(model.model, list(data)[:8], source="planted")
    costs = CostModel(
        spec, load_calibration("emulated"), num_hosts=3, ranks_per_host=2, batch_size=256
    )
    learned = partition_tables(costs, len(groups), affinity=affinity, seed=seed)
    balanced = partition_tables(costs, len(groups))
    return [list(t.tables) for t in learned], [list(t.tables) for t in balanced]


def test_a_flat_warm_up_on_planted_data_finds_the_groups_far_above_chance() -> None:
    """End to end: clicks depend only on the pairs inside three groups of four features
    (:class:`~lightning_embark.data.InteractionDataset`); a flat DLRM trains 250 steps, its
    affinity is measured and the partitioner makes three towers (exact recovery for 20 of
    20 seeds and plantings tried at 250 steps, 19 of 20 at 150). The statistic is the
    adjusted Rand index of the towers against the groups, and the bar is derived, not
    tuned: the chance that a uniformly random partition with the towers' sizes scores at
    least as high, computed exactly by enumerating them all, must be below 0.001 (for
    exact recovery it is 1 / 5775, one of the distinct partitions into three fours). Two
    plantings (different groups, different seeds) must each be found, and the
    statistics-only partition of the same tables, scored the same way, must not pass the
    bar: the statistic tells a partition that knows the groups from one that does not."""
    names = [f"f{i}" for i in range(12)]
    for seed, order in ((0, [0, 5, 8, 10, 1, 3, 9, 11, 2, 4, 6, 7]), (1, list(range(12)))):
        groups = [[names[j] for j in order[g * 4 : (g + 1) * 4]] for g in range(3)]
        truth_of = {f: g for g, group in enumerate(groups) for f in group}
        truth = [truth_of[f] for f in names]
        for towers, found_groups in zip(
            ("learned", "statistics-only"), _planted_towers(names, groups, seed), strict=True
        ):
            labels = {f: t for t, tower in enumerate(found_groups) for f in tower}
            score = _ari(truth, [labels[f] for f in names])
            chance = _chance_of_at_least(score, truth, [len(t) for t in found_groups])
            what = (
                f"seed {seed} {towers} towers {found_groups}: ARI {score:.3f}, chance {chance:.2g}"
            )
            assert (chance < 0.001) == (towers == "learned"), what
