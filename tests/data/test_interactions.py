"""InteractionDataset: the planted-pairs teacher, the sharding rule, bad groups named."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lightning_embark.data import InteractionDataset, ctr_spec
from lightning_embark.errors import ConfigError

NAMES = ["a", "b", "c", "d", "e"]
GROUPS = [["a", "c"], ["b", "d", "e"]]


def _spec():
    return ctr_spec(dict(zip(NAMES, (7, 11, 13, 5, 3), strict=True)), num_dense_features=0)


def test_the_logit_is_the_planted_pairs_dot_products() -> None:
    """``scale * sum_{pairs} <u_i, u_j> / sqrt(P rank)``, recomputed from each row's
    vector: pairs (a, c), (b, d), (b, e), (d, e); nothing else enters."""
    data = InteractionDataset(_spec(), GROUPS, batch_size=64, num_batches=1, seed=3, scale=2.0)
    batch = data.examples(0, 64)
    ids = [batch.sparse_features[n].values().numpy() for n in NAMES]
    u = [data._vectors(t, ids[t]) for t in range(5)]
    pairs = [(0, 2), (1, 3), (1, 4), (3, 4)]
    logit = 2.0 * sum((u[i] * u[j]).sum(1) for i, j in pairs) / math.sqrt(4 * 4)
    np.testing.assert_allclose(data.teacher_probabilities(0, 64), 1 / (1 + np.exp(-logit)))
    assert all(bool((batch.sparse_features[n].lengths() == 1).all()) for n in NAMES)
    rows = (7, 11, 13, 5, 3)
    assert all(int(i.min()) >= 0 and int(i.max()) < r for i, r in zip(ids, rows, strict=True))
    # Labels follow the teacher: its AUC on 4,096 draws is well above a coin's.
    probs = data.teacher_probabilities(0, 4096)
    labels = data.examples(0, 4096).labels.numpy()
    order = np.argsort(probs)
    ranks = np.empty(len(probs))
    ranks[order] = np.arange(1, len(probs) + 1)
    positives = labels.sum()
    auc = (ranks[labels == 1].sum() - positives * (positives + 1) / 2) / (
        positives * (len(labels) - positives)
    )
    assert auc > 0.7


def test_ranks_take_their_rows_of_the_global_batch() -> None:
    whole = InteractionDataset(_spec(), GROUPS, batch_size=8, num_batches=2, seed=1)
    parts = [
        list(
            InteractionDataset(
                _spec(), GROUPS, batch_size=4, num_batches=2, seed=1, rank=r, world_size=2
            )
        )
        for r in range(2)
    ]
    for step, batch in enumerate(whole):
        joined = torch.cat([parts[r][step].labels for r in range(2)])
        assert torch.equal(joined, batch.labels)
        for name in NAMES:
            ids = torch.cat([parts[r][step].sparse_features[name].values() for r in range(2)])
            assert torch.equal(ids, batch.sparse_features[name].values())
    assert len(whole) == 2


@pytest.mark.parametrize(
    "groups", [[["a"]], [["a", "b"], ["b", "c"]], [["a", "z"]]], ids=["single", "twice", "unknown"]
)
def test_bad_groups_are_refused(groups) -> None:
    with pytest.raises(ConfigError, match="interaction groups"):
        InteractionDataset(_spec(), groups, batch_size=4, num_batches=1)
