"""The learned feature affinity against its definition, computed the slow way.

For the dot interaction the pair terms are read off torchrec's own ``InteractionArch``
output; for DCN the block products ``W_i V_j e_j`` are formed explicitly per sample.
Both sides run in float64 from the same float32 weights and embeddings, so they differ
only by summation order: a relative tolerance of ``1e-9`` is ample (float64 rounding
over at most a few thousand terms is ~1e-13).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torchrec.datasets.utils import Batch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from lightning_embark.errors import ConfigError
from lightning_embark.models import DLRMModule
from lightning_embark.planner import measure_affinity
from lightning_embark.spec import ModelSpec, TableSpec

FEATURES = ("a", "b", "c", "d")
DIM = 4


def _spec() -> ModelSpec:
    tables = tuple(
        TableSpec(name=n, num_embeddings=50, embedding_dim=DIM, pooling_factor=1.5)
        for n in FEATURES
    )
    return ModelSpec(name="tiny", tables=tables, num_dense_features=3)


def _batches(count: int = 3, size: int = 16) -> list[Batch]:
    gen = torch.Generator().manual_seed(0)
    out = []
    for _ in range(count):
        lengths = torch.randint(0, 3, (len(FEATURES) * size,), generator=gen)
        values = torch.randint(0, 50, (int(lengths.sum()),), generator=gen)
        kjt = KeyedJaggedTensor.from_lengths_sync(list(FEATURES), values, lengths)
        out.append(
            Batch(
                dense_features=torch.randn(size, 3, generator=gen),
                sparse_features=kjt,
                labels=torch.randint(0, 2, (size,), generator=gen).float(),
            )
        )
    return out


def _model(interaction: str) -> DLRMModule:
    torch.manual_seed(0)
    module = DLRMModule(
        _spec(),
        interaction=interaction,
        dense_arch_layer_sizes=[8, DIM],
        over_arch_layer_sizes=[6, 1],
        dcn_num_layers=2,
        dcn_low_rank_dim=3,
    )
    module.materialize_embeddings()
    return module


def test_dot_affinity_is_the_rms_of_each_pair_term_at_the_top_mlp() -> None:
    dlrm = _model("dot").model
    batches = _batches()
    got = measure_affinity(dlrm, batches).matrix
    first = dlrm.over_arch.model[0]._mlp[0]._linear  # the top MLP's first layer
    f = len(FEATURES)
    rows, cols = torch.triu_indices(f + 1, f + 1, offset=1)
    with torch.no_grad():
        inter = torch.cat(
            [
                dlrm.inter_arch(  # no parameters: run in float64 like the measure
                    dlrm.dense_arch(b.dense_features).double(),
                    dlrm.sparse_arch(b.sparse_features).double(),
                )
                for b in batches
            ]
        )
    want = np.zeros((f, f))
    for k, (r, c) in enumerate(zip(rows.tolist(), cols.tolist(), strict=True)):
        if r == 0:
            continue  # the dense vector's pairs are not in the affinity
        term = inter[:, DIM + k, None] * first.weight.detach().double()[None, :, DIM + k]
        rms = term.pow(2).sum(1).mean().sqrt().item()  # sqrt(E ||z w||^2)
        want[r - 1, c - 1] = want[c - 1, r - 1] = rms
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=0)
    assert (got[np.triu_indices(f, 1)] > 0).all()


def test_dcn_affinity_follows_the_block_products_of_the_cross_layers() -> None:
    dlrm = _model("dcn").model
    batches = _batches()
    got = measure_affinity(dlrm, batches).matrix
    with torch.no_grad():
        emb = torch.cat([dlrm.sparse_arch(b.sparse_features) for b in batches]).double()
    f = len(FEATURES)
    net = dlrm.inter_arch.crossnet
    mean_square = emb.pow(2).mean(dim=(0, 2))
    total = np.zeros((f, f))
    for w, v in zip(net.W_kernels, net.V_kernels, strict=True):
        m = (w.detach().double() @ v.detach().double()).numpy()  # N x N, N = (F + 1) d
        for i in range(f):
            for j in range(f):
                block = m[(i + 1) * DIM : (i + 2) * DIM, (j + 1) * DIM : (j + 2) * DIM]
                reach = (emb[:, j].numpy() @ block.T) ** 2  # ||W_i V_j e_j||^2 per sample
                total[i, j] += np.sqrt(mean_square[i].item() * reach.sum(1).mean())
    want = 0.5 * (total + total.T)
    np.fill_diagonal(want, 0.0)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=0)


def test_a_feature_the_top_mlp_ignores_has_no_affinity() -> None:
    dlrm = _model("dot").model
    first = dlrm.over_arch.model[0]._mlp[0]._linear
    f = len(FEATURES)
    rows, cols = torch.triu_indices(f + 1, f + 1, offset=1)
    with torch.no_grad():
        for k, (r, c) in enumerate(zip(rows.tolist(), cols.tolist(), strict=True)):
            if 2 in (r, c):  # feature "b" is index 2 in the interaction (dense is 0)
                first.weight[:, DIM + k] = 0.0
    got = measure_affinity(dlrm, _batches()).matrix
    assert (got[1] == 0).all() and (got[:, 1] == 0).all()
    assert got[0, 2] > 0


def test_models_it_cannot_read_and_missing_batches_are_refused() -> None:
    with pytest.raises(ConfigError, match="has no sparse_arch"):
        measure_affinity(torch.nn.Linear(2, 2), _batches())
    with pytest.raises(ConfigError, match="no batches"):
        measure_affinity(_model("dot").model, [])
