"""Analytic bytes of the towers (:mod:`._towers`), as the byte counter counts them.

Per rank ``q = (h, l)`` and step, with ``R(q)`` its rail peers ``(g, l)``:

* **header**: ``8 (1 + F_g)`` bytes to each rail peer ``g`` (``F_g``: the features of
  ``g``'s towers), or, when no flat cluster exchanges first, a world header that also
  sends 8 bytes to every other rank;
* **IDs**: to each rail peer ``g``, ``sum_{f in F_g} (B_q + n_f (1 + weighted))`` values
  of the ID dtype (lengths, IDs, weights bit-cast);
* **inner clusters**: the host's tower tables, as the host plan's analytic bytes over the
  ``V`` samples that arrived (sources in host order), all inside the host;
* **outputs**: a tower rank sends each rail peer ``s`` ``B_s sum_t row_bytes(O_t)`` of its
  towers in each compression group forward; backward every rank sends each tower host
  the gradient rows of its samples with the backward codec;
* **tower modules**: a ring all-reduce of ``4 P`` bytes over the host (``P``: the
  parameters of the host's tower modules), backward.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from lightning_embark.engine._batch import FeatureBatch
from lightning_embark.engine._link_bytes import LinkBytes, StepBytes, link
from lightning_embark.engine._routing import INT32_MAX, FeatureInfo, TableInfo
from lightning_embark.engine._tower_modules import tower_module
from lightning_embark.errors import ConfigError
from lightning_embark.plan import Plan, TowerModule, host_plan
from lightning_embark.wire import codec_for

#: Part -> (forward, backward) bytes of every rank.
Parts = dict[str, tuple[list[LinkBytes], list[LinkBytes]]]
#: The flat model: (plan, configs, every rank's batch) -> every rank's step bytes.
Inner = Callable[[Plan, list[Any], list[dict[str, FeatureBatch]]], list[StepBytes]]


def tower_parameters(
    plan: Plan,
    features: Sequence[FeatureInfo],
    dims: Mapping[str, int],
    given: Mapping[str, int] | None = None,
) -> dict[str, int]:
    """Parameters of each non-identity tower's module: ``given`` or the built-in kind's
    (its input is every feature of its tables: ``D_t``)."""
    out = {}
    for tower in plan.towers:
        if tower.module is TowerModule.IDENTITY:
            continue
        if given is not None and tower.name in given:
            out[tower.name] = int(given[tower.name])
            continue
        if tower.module is TowerModule.CUSTOM:
            raise ConfigError(
                f"tower {tower.name!r} is 'custom': give its parameter count "
                "(tower_parameters={name: count}) to count its all-reduce"
            )
        assert tower.output_dim is not None  # TowerPlan checks it
        widths = [dims[f.table] for f in features if f.table in tower.tables]
        # On the meta device: only the shapes are counted, nothing is allocated.
        module = tower_module(
            tower.module.value,
            sum(widths),
            tower.output_dim,
            features=len(widths),
            device="meta",
        )
        out[tower.name] = sum(p.numel() for p in module.parameters())
    return out


def tower_bytes(
    plan: Plan,
    tables: Sequence[TableInfo],
    features: Sequence[FeatureInfo],
    configs: Sequence[Any],
    per_key: Sequence[dict],
    *,
    weighted: bool,
    status_on_world: bool,
    parameters: Mapping[str, int],
    inner: Inner,
) -> Parts:
    """The towers' bytes per part: ``towers:ids``, ``towers:outputs``, ``towers:modules``
    and each inner cluster (see the module docstring)."""
    world, local, hosts = plan.world_size, plan.ranks_per_host, plan.num_hosts
    dims = {t.name: t.dim for t in tables}
    host_of = {t: tower.host for tower in plan.towers for t in tower.tables}
    positions = [
        [i for i, f in enumerate(features) if host_of.get(f.table) == g] for g in range(hosts)
    ]
    rows = max((t.num_rows for t in tables if t.name in host_of), default=0)
    id_size = 4 if rows <= INT32_MAX else 8
    sizes = [_batch_size(per_key[q], features) for q in range(world)]
    zero = [LinkBytes() for _ in range(world)]
    ids, out_f, out_b, mods = list(zero), list(zero), list(zero), list(zero)
    for q in range(world):
        lr = q % local
        for g in range(hosts):
            counts = [per_key[q][features[i].name][0].numel() for i in positions[g]]
            sent = 8 * (1 + len(counts)) + id_size * sum(
                sizes[q] + n * (2 if weighted else 1) for n in counts
            )
            ids[q] += link(q, g * local + lr, sent, local)
        if status_on_world:
            for p in range(world):
                if p % local != lr:
                    ids[q] += link(q, p, 8, local)
    widths = {  # identity: every feature's pooled vector (a table may feed several)
        t.name: sum(dims[f.table] for f in features if f.table in t.tables)
        if t.output_dim is None
        else t.output_dim
        for t in plan.towers
    }
    groups: dict[tuple[str, str], list] = {}
    for t in plan.towers:
        groups.setdefault((t.forward_compression, t.backward_compression), []).append(t)
    for (fwd, bwd), towers in groups.items():
        fc, bc = codec_for(fwd, backward=False), codec_for(bwd, backward=True)
        for q in range(world):
            for g in range(hosts):
                peer = g * local + q % local
                mine = [t for t in towers if t.host == g]
                out_f[peer] += link(
                    peer, q, sizes[q] * sum(fc.row_bytes(widths[t.name]) for t in mine), local
                )
                out_b[q] += link(
                    q, peer, sizes[q] * sum(bc.row_bytes(widths[t.name]) for t in mine), local
                )
    parts: Parts = {"towers:ids": (ids, list(zero)), "towers:outputs": (out_f, out_b)}
    config_of = {t.name: c for t, c in zip(tables, configs, strict=True)}
    for g in range(hosts):
        sub = host_plan(plan, g)
        if not sub.tables:
            continue
        base = g * local
        params = sum(parameters.get(t.name, 0) for t in plan.towers if t.host == g)
        if params and local > 1:
            ring = round(2.0 * (local - 1) * 4 * params / local)
            for lr in range(local):
                mods[base + lr] += link(base + lr, base + (lr + 1) % local, ring, local)
        sub_configs = [config_of[t.table] for t in sub.tables]
        keys = [f for c in sub_configs for f in c.feature_names]
        batches = [
            _virtual_batch(keys, [per_key[s * local + lr] for s in range(hosts)])
            for lr in range(local)
        ]
        for lr, step in enumerate(inner(sub, sub_configs, batches)):
            for name, (fwd_bytes, bwd_bytes) in step.by_cluster.items():
                fwd_all, bwd_all = parts.setdefault(name, (list(zero), list(zero)))
                fwd_all[base + lr] += fwd_bytes
                bwd_all[base + lr] += bwd_bytes
    parts["towers:modules"] = (list(zero), mods)
    return parts


def _batch_size(jagged: dict, features: Sequence[FeatureInfo]) -> int:
    return int(jagged[features[0].name][1].numel()) if features else 0


def _virtual_batch(keys: list[str], sources: list[dict]) -> dict[str, FeatureBatch]:
    """The samples a tower rank serves: every source's, in host order, per feature."""
    return {
        key: FeatureBatch(
            values=torch.cat([src[key][0] for src in sources]).to(torch.int64),
            lengths=torch.cat([src[key][1] for src in sources]).to(torch.int64),
        )
        for key in keys
    }
