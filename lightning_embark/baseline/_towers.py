"""torchrec's own towers on the baseline: ``EmbeddingTowerCollectionSharder`` on CPU/gloo.

torchrec shards an ``EmbeddingTowerCollection`` with ``EmbeddingTowerCollectionSharder``
(not among its default sharders): each tower's tables on one host, table-row-wise or
table-column-wise; the raw IDs cross hosts once (``KJTAllToAll`` over the cross-host
group), the tower's lookup is sharded inside the host, its module runs in DDP over the
intra-host group, and only the tower's output comes back (``PooledEmbeddingsAllToAll``).
That is the DMT design, so torchrec's version is the baseline of ``embark-towers``.
In torchrec 1.8 it needs three fixes to run on CPU ranks over gloo, all measured:

* ``ShardedEmbeddingTowerCollection`` wraps each tower module in
  ``DistributedDataParallel(device_ids=[device])``
  (``torchrec/distributed/embedding_tower_sharding.py:604-611``), which DDP refuses for
  a CPU module (``ValueError`` "device_ids and output_device arguments only work with
  single-device/multiple-device GPU modules", ``torch/nn/parallel/distributed.py:939``).
  :class:`TowerCollectionSharder` builds it with ``device=None`` on CPU, where every
  tensor it allocates lands on the CPU anyway and DDP gets no ``device_ids``.
* The sharded collection concatenates the towers' outputs by host (the cross-host
  all-to-all's rank order), not in the collection's order, while torchrec's planner
  picks each tower's host by load alone; a plan with tower 0 on host 1 permutes the
  interaction's inputs. :func:`order_towers_by_host` gives the planner's hosts, sorted,
  to the towers in their order.
* A tower module without parameters (an identity tower) cannot be wrapped in DDP at all
  (``RuntimeError`` "DistributedDataParallel is not needed when a module doesn't have
  any parameter that requires a gradient", ``torch/nn/parallel/distributed.py:906``):
  such a collection is refused with a :class:`ConfigError` saying so.

Gradients follow DDP's mean: the tower module's all-reduce over the host's ``L`` ranks
and torchrec's gradient division by the cross-host group's ``H`` ranks in the output
all-to-all's backward give it ``(1 / (H L)) sum_r grad loss_r``, as for the dense part.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn
from torch.distributed._shard.metadata import ShardMetadata
from torch.distributed._shard.sharding_spec import EnumerableShardingSpec
from torchrec.distributed.embedding_tower_sharding import (
    EmbeddingTowerCollectionSharder,
    EmbeddingTowerSharder,
    ShardedEmbeddingTowerCollection,
)
from torchrec.distributed.types import ParameterSharding, ShardingEnv, ShardingPlan
from torchrec.modules.embedding_tower import EmbeddingTowerCollection

from lightning_embark.errors import ConfigError

#: Why a tower module without parameters cannot run under torchrec's tower sharding.
PARAMETERLESS_TOWER_REASON = (
    "torchrec's ShardedEmbeddingTowerCollection wraps every tower module in "
    "DistributedDataParallel over its host (torchrec/distributed/embedding_tower_sharding.py"
    ':604), and DDP refuses a module without trainable parameters ("DistributedDataParallel '
    "is not needed when a module doesn't have any parameter that requires a gradient\", "
    "torch/nn/parallel/distributed.py:906)"
)


def check_tower_modules(collection: EmbeddingTowerCollection) -> None:
    """Refuse a collection that torchrec's tower sharding cannot wrap.

    Raises:
        ConfigError: a tower's module has no trainable parameter (an identity tower);
            the message names the tower, the reason and the fix.
    """
    for index, tower in enumerate(collection.towers):
        interaction = tower.interaction
        assert isinstance(interaction, nn.Module)
        if not any(p.requires_grad for p in interaction.parameters()):
            raise ConfigError(
                f"tower {index} of the EmbeddingTowerCollection has a tower module without "
                f"trainable parameters ({type(interaction).__name__}): "
                f"{PARAMETERLESS_TOWER_REASON}; give the towers projection or dcn modules, or "
                "shard identity towers with strategy='embark'"
            )


class TowerCollectionSharder(EmbeddingTowerCollectionSharder):
    """torchrec's ``EmbeddingTowerCollectionSharder``, able to shard onto CPU ranks.

    On CPU the sharded collection is built with ``device=None`` so that its tower
    modules' DDP gets no ``device_ids`` (see the module docstring); on any other device
    it is torchrec's. The plan's parameter shardings are copied first: torchrec rewrites
    them in place to their intra-host form (row-wise, host-local ranks), which would
    leave the strategy's plan describing one host's view of it.
    """

    def shard(
        self,
        module: EmbeddingTowerCollection,
        params: dict[str, ParameterSharding],
        env: ShardingEnv,
        device: torch.device | None = None,
        module_fqn: str | None = None,
    ) -> ShardedEmbeddingTowerCollection:
        """Shard ``module`` over ``env`` as torchrec does (see the class docstring).

        Raises:
            ConfigError: a tower module has no parameters (:func:`check_tower_modules`).
        """
        check_tower_modules(module)
        on_cpu = device is not None and device.type == "cpu"
        return ShardedEmbeddingTowerCollection(
            module=module,
            table_name_to_parameter_sharding=copy.deepcopy(params),
            tower_sharder=self._tower_sharder,
            env=env,
            fused_params=self.fused_params,
            device=None if on_cpu else device,
            qcomm_codecs_registry=self.qcomm_codecs_registry,
        )


def order_towers_by_host(
    plan: ShardingPlan, module: nn.Module, *, ranks_per_host: int
) -> ShardingPlan:
    """``plan`` with every tower collection's towers on non-decreasing hosts, in order.

    torchrec's planner keeps a tower's tables on one host but chooses the host by load;
    the sharded collection returns its towers' outputs in host order. So the hosts the
    planner chose, sorted, go to the towers in the collection's order: tower ``t`` moves
    from host ``h_t`` to ``sorted(h)[t]`` with its layout inside the host (sharding
    type, local ranks, shard sizes) unchanged, and each host holds as many towers as
    the planner gave it. Plans of other modules are left alone.

    Args:
        plan: torchrec's plan for ``module`` (module paths relative to ``module``).
        module: The unsharded module the plan is for.
        ranks_per_host: ``L``, the ranks of one host (torchrec's ``local_world_size``).
    """
    for path, child in module.named_modules():
        if isinstance(child, EmbeddingTowerCollection) and path in plan.plan:
            module_plan: Any = plan.plan[path]
            tables = [
                list(EmbeddingTowerSharder().shardable_parameters(tower)) for tower in child.towers
            ]
            hosts = [_host_of(module_plan, names, ranks_per_host) for names in tables]
            for names, host, target in zip(tables, hosts, sorted(hosts), strict=True):
                for name in names:
                    module_plan[name] = _moved(module_plan[name], (target - host) * ranks_per_host)
    return plan


def _host_of(module_plan: Any, tables: list[str], ranks_per_host: int) -> int:
    hosts = {rank // ranks_per_host for name in tables for rank in module_plan[name].ranks}
    # torchrec's planner groups a tower's tables (their "dependency"), and its sharded
    # collection asserts the same: one tower, one host.
    assert len(hosts) == 1, f"tower tables {tables} span hosts {sorted(hosts)}"
    return hosts.pop()


def _moved(sharding: ParameterSharding, shift: int) -> ParameterSharding:
    """``sharding`` with every rank shifted by ``shift`` (a whole number of hosts)."""
    if shift == 0:
        return sharding
    moved = copy.deepcopy(sharding)
    moved.ranks = [rank + shift for rank in sharding.ranks or []]
    spec = sharding.sharding_spec
    if isinstance(spec, EnumerableShardingSpec):
        shards = []
        for shard in spec.shards:
            placement = shard.placement
            rank = None if placement is None else placement.rank()
            assert placement is not None and rank is not None
            shards.append(
                ShardMetadata(
                    shard_offsets=list(shard.shard_offsets),
                    shard_sizes=list(shard.shard_sizes),
                    placement=f"rank:{rank + shift}/{placement.device()}",
                )
            )
        moved.sharding_spec = EnumerableShardingSpec(shards)
    return moved
