"""The engine imports and runs without torchrec and fbgemm, as on a bare CUDA image.

A subprocess hides both packages (an import hook that refuses them, so neither can load
even where installed), imports :mod:`lightning_embark.engine` and trains one step of a
world-1 gloo :class:`~lightning_embark.engine.EmbeddingEngine` holding a DP, an RB and
a UB table, fed jagged IDs per feature. The oracle is ``torch.nn.functional.embedding_bag``
over the same initial weights, with SGD applied by hand.

Tolerances: with one rank, every cluster pools the same rows in bag order with fp32 sums
and SGD updates each row by ``lr * sum of its gradients``; the engine may add a bag's rows
in another order, so a pooled value differs from the oracle's by at most fp32 summation
error, ``(len - 1) * eps * sum |w|`` (bags here hold at most 4 rows of weights below 0.5
in magnitude: under ``3 * 2**-24 * 2 = 3.6e-7``), and an updated weight by ``lr`` times the
same bound on summed gradients of ones (exact: sums of at most a few ones are exact in
fp32). 1e-6 absolute covers both.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SCRIPT = textwrap.dedent(
    r"""
    import importlib.abc, json, os, sys

    class Refuse(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] in ("torchrec", "fbgemm_gpu"):
                raise ImportError(f"{name} is hidden in this test")
            return None

    sys.meta_path.insert(0, Refuse())
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from lightning_embark.engine import (
        EmbeddingEngine,
        EngineConfig,
        FeatureBatch,
        SparseOptimizer,
        TableConfig,
    )
    from lightning_embark.plan import ClusterPlan, ClusterType, Plan, layouts

    dist.init_process_group("gloo", init_method=f"file://{sys.argv[1]}", rank=0, world_size=1)
    tables = [
        TableConfig(name="t_a", num_embeddings=10, embedding_dim=4, feature_names=("a",)),
        TableConfig(name="t_b", num_embeddings=12, embedding_dim=4, feature_names=("b",)),
        TableConfig(
            name="t_c", num_embeddings=8, embedding_dim=4, feature_names=("c",), pooling="mean"
        ),
    ]
    plan = Plan(
        world_size=1,
        ranks_per_host=1,
        clusters=(
            ClusterPlan(name="dp", type=ClusterType.DP),
            ClusterPlan(name="rb", type=ClusterType.RB),
            ClusterPlan(name="ub", type=ClusterType.UB),
        ),
        tables=(
            layouts.data_parallel("t_a", "dp", 1),
            layouts.table_wise("t_b", "rb", 0),
            layouts.table_wise("t_c", "ub", 0),
        ),
    )
    generator = torch.Generator().manual_seed(0)
    weights = {
        t.name: torch.rand(t.num_embeddings, t.embedding_dim, generator=generator) - 0.5
        for t in tables
    }
    lr = 0.1
    engine = EmbeddingEngine(
        tables,
        plan,
        sparse_optimizer=SparseOptimizer(kind="sgd", lr=lr),
        config=EngineConfig(store="torch"),
        weights=weights,
    )
    lengths = {"a": [2, 0, 1], "b": [1, 3, 2], "c": [4, 1, 0]}
    batch = {}
    for t in tables:
        (f,) = t.feature_names
        n = torch.tensor(lengths[f])
        ids = torch.randint(0, t.num_embeddings, (int(n.sum()),), generator=generator)
        batch[f] = FeatureBatch(values=ids, lengths=n)
    out = engine.lookup(batch)
    out.sum().backward()

    expected, updated = [], {}
    for t in tables:
        (f,) = t.feature_names
        w = weights[t.name].clone().requires_grad_(True)
        fb = batch[f]
        offsets = torch.cat([torch.zeros(1, dtype=torch.long), fb.lengths.cumsum(0)[:-1]])
        pooled = F.embedding_bag(fb.values, w, offsets, mode=t.pooling)
        pooled.sum().backward()
        expected.append(pooled.detach())
        updated[t.name] = (weights[t.name] - lr * w.grad)
    want = torch.cat(expected, dim=1)
    got = {}
    for shard in engine.local_shards():
        got[shard.table] = shard.weight
    report = {
        "keys": engine.output_keys,
        "dims": engine.output_dims,
        "forward": float((out.detach() - want).abs().max()),
        "weights": max(float((got[n] - updated[n]).abs().max()) for n in updated),
        "modules": sorted(m for m in sys.modules if m.split(".")[0] in ("torchrec", "fbgemm_gpu")),
    }
    dist.destroy_process_group()
    print(json.dumps(report))
    """
)


def test_the_engine_trains_a_step_with_torchrec_and_fbgemm_hidden(tmp_path: Path) -> None:
    script = tmp_path / "bare.py"
    script.write_text(SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "store")],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "TRITON_INTERPRET": "1"},
    )
    if done.returncode != 0:
        pytest.fail(f"the engine failed without torchrec:\n{done.stderr[-4000:]}")
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["modules"] == []
    assert report["keys"] == ["a", "b", "c"] and report["dims"] == [4, 4, 4]
    assert report["forward"] <= 1e-6
    assert report["weights"] <= 1e-6
