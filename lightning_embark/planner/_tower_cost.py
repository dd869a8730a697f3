"""What towers add to a step beyond their tables' intra-host clusters (DMT cost terms).

The tables of a tower are priced by the ordinary cluster terms, as the plan its host's
ranks run among themselves (:func:`~lightning_embark.plan.host_plan`) over the
``V = H * B`` samples that arrive there. What remains is priced here, per rank ``q``
(host ``h``) of ``H`` hosts, each tower ``t`` on host ``g_t`` with features ``f``
(hotness ``h_f``) and output width ``O_t``:

* **IDs across hosts**, int32, once: ``q`` sends ``B sum_f 4 (1 + h_f)`` bytes (bag
  lengths and IDs) for every tower on another host; a rank of ``g_t`` receives that
  from each of the ``H - 1`` other hosts.
* **Tower output across hosts**, forward and backward: ``B * row_bytes(O_t)`` per
  sample owner and tower on another host; the tower's rank sends ``H - 1`` of those
  forward and receives them backward.
* **Per-call latency** of the rail all-to-alls: a header, the IDs, and per distinct
  compression one output and one gradient exchange, each among ``H`` peers.
* **Tower-module parameters**: summed inside the host each step, an all-reduce of
  ``4 P`` bytes over the host's ``L`` ranks (``P = D_t O_t + O_t`` for a projection,
  plus ``D_t^2 + D_t`` for the DCN cross layer; a dot tower's projection is ``O_t -
  n (n - 1) / 2`` wide, ``n`` its tables; a custom module is priced as a projection).
* **Tower-module compute**: every rank of ``g_t`` runs the module over the ``V = H B``
  samples it received, forward and backward: ``6 V P`` FLOPs (a matmul's forward is
  ``2 D O`` per sample, its two gradients ``4 D O``), and for a dot tower ``6 V d n
  (n - 1) / 2`` more for its pair terms, at the calibration's ``dense_flops``. Not
  small: a ratio-4 projection of 14 tables of width 128 over ``V = 2048`` is 10 GFLOP,
  a quarter of a second on a CPU rank.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from lightning_embark.plan import Plan, TowerModule, TowerPlan, dot_pairs
from lightning_embark.wire import row_bytes

ID_BYTES = 4


@dataclass(frozen=True, kw_only=True)
class RailTerms:
    """Per-rank bytes across hosts (forward and backward together) and rail calls."""

    sent: np.ndarray
    received: np.ndarray
    calls: int


def tower_widths(plan: Plan, dims: dict[str, int]) -> dict[str, tuple[int, int]]:
    """``(D_t, O_t)`` of every tower: its tables' total width and its output width."""
    out = {}
    for tower in plan.towers:
        width = sum(dims[t] for t in tower.tables)
        out[tower.name] = (width, width if tower.output_dim is None else tower.output_dim)
    return out


def module_parameters(kind: TowerModule, in_dim: int, out_dim: int, features: int = 1) -> int:
    """Parameters of a tower module of ``features`` tables (see the module docstring)."""
    if kind is TowerModule.IDENTITY:
        return 0
    if kind is TowerModule.DOT:
        out_dim -= dot_pairs(features)
    projection = in_dim * out_dim + out_dim
    return projection + (in_dim * in_dim + in_dim if kind is TowerModule.DCN else 0)


def module_flops(kind: TowerModule, in_dim: int, out_dim: int, features: int = 1) -> float:
    """Forward plus backward FLOPs of a tower module per sample: ``6 P``, and a dot
    tower's pair terms, ``6 d n (n - 1) / 2`` (see the module docstring)."""
    flops = 6.0 * module_parameters(kind, in_dim, out_dim, features)
    if kind is TowerModule.DOT:
        flops += 6.0 * (in_dim / features) * dot_pairs(features)
    return flops


def rail_terms(
    plan: Plan, *, batch_size: int, hotness: dict[str, float], dims: dict[str, int]
) -> RailTerms:
    """Bytes every rank sends and receives across hosts for the towers, and the calls."""
    world, local, hosts = plan.world_size, plan.ranks_per_host, plan.num_hosts
    sent, received = np.zeros(world), np.zeros(world)
    if hosts == 1 or not plan.towers:
        return RailTerms(sent=sent, received=received, calls=0)
    widths = tower_widths(plan, dims)
    for tower in plan.towers:
        ids = batch_size * sum(ID_BYTES * (1.0 + hotness[t]) for t in tower.tables)
        out_dim = widths[tower.name][1]
        forward = batch_size * row_bytes(tower.forward_compression, out_dim, backward=False)
        backward = batch_size * row_bytes(tower.backward_compression, out_dim, backward=True)
        for rank in range(world):
            if rank // local == tower.host:
                sent[rank] += (hosts - 1) * forward
                received[rank] += (hosts - 1) * (ids + backward)
            else:
                sent[rank] += ids + backward
                received[rank] += forward
    groups = {(t.forward_compression, t.backward_compression) for t in plan.towers}
    return RailTerms(sent=sent, received=received, calls=2 + 2 * len(groups))


def host_module_flops(plan: Plan, dims: dict[str, int], *, samples: int) -> Sequence[float]:
    """Forward plus backward FLOPs of each host's tower modules on one of its ranks, over
    the ``samples`` that rank receives (:func:`module_flops` per sample and module)."""
    out = [0.0] * plan.num_hosts
    for tower, kind, widths in _modules(plan, dims):
        out[tower.host] += samples * module_flops(kind, *widths, len(tower.tables))
    return out


def host_parameters(plan: Plan, dims: dict[str, int]) -> Sequence[int]:
    """Tower-module parameters each host sums per step."""
    out = [0] * plan.num_hosts
    for tower, kind, widths in _modules(plan, dims):
        out[tower.host] += module_parameters(kind, *widths, len(tower.tables))
    return out


def _modules(
    plan: Plan, dims: dict[str, int]
) -> list[tuple[TowerPlan, TowerModule, tuple[int, int]]]:
    """Every tower, the kind it is priced as (a custom module as a projection), ``(D_t,
    O_t)``."""
    widths = tower_widths(plan, dims)
    return [
        (
            tower,
            TowerModule.PROJECTION if tower.module is TowerModule.CUSTOM else tower.module,
            widths[tower.name],
        )
        for tower in plan.towers
    ]
