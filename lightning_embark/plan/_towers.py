"""Towers in a plan (DMT): tables that live on one host, and what leaves the host.

A tower is a set of tables whose blocks all live on the ranks of one host. Every rank
sends the IDs of the tower's features for its samples across hosts once, to the rank
of the tower's host with its own local rank; there the tables are looked up over the
samples of every host, inside the host, by the tower's ordinary embedding clusters;
the tower module runs there; and only its output crosses hosts back. Tables in no
tower stay flat (any layout over the whole world).

A tower's clusters are ordinary :class:`~lightning_embark.plan.ClusterPlan` s whose
tables all belong to towers of that host, and its layouts name global ranks of that
host. A data-parallel table inside a tower is replicated on the host's ranks only
(``r = ranks_per_host``), since no rank elsewhere ever looks it up.
``host_plan`` (:mod:`._host`) is the plan the host's ranks execute among themselves: the same
layouts with ranks counted inside the host.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from lightning_embark.errors import ConfigError
from lightning_embark.plan._kinds import Compression, _enum


class TowerModule(enum.StrEnum):
    """What runs on a tower's host between its lookup and the exchange back.

    * ``identity``: the pooled vectors themselves (the semantic-preserving transform:
      the model is the flat model with its features regrouped).
    * ``projection``: one linear map from the tower's concatenated width ``D_t`` to
      ``output_dim``.
    * ``dcn``: a DCN-v2 cross layer over the tower's features, then the projection.
    * ``dot``: the tower's features' pairwise dot products, exact (:func:`dot_pairs` of
      them), beside a projection; ``output_dim`` counts both. Its tables need one width.
    * ``custom``: a module the model supplies (for example a torchrec
      ``EmbeddingTower``'s interaction module); ``output_dim`` says its width.
    """

    IDENTITY = "identity"
    PROJECTION = "projection"
    DCN = "dcn"
    DOT = "dot"
    CUSTOM = "custom"


def dot_pairs(features: int) -> int:
    """``n (n - 1) / 2``: the pair terms a ``dot`` tower of ``n`` features sends."""
    return features * (features - 1) // 2


@dataclass(frozen=True, kw_only=True)
class TowerPlan:
    """One tower: its host, its tables, its module and the wire format of its output.

    Attributes:
        name: Unique among the plan's towers (the tower module's key in the model).
        host: The host whose ranks hold every block of the tower's tables.
        tables: Plan names of its tables; every feature reading one belongs to it.
        module: The tower module's kind.
        output_dim: Width of the tower's output per sample; None for ``identity``
            (the tables' pooled widths, feature by feature).
        forward_compression: Wire format of the output crossing back to the samples'
            ranks (a :class:`~lightning_embark.plan.Compression` value).
        backward_compression: Wire format of its gradient.
    """

    name: str
    host: int
    tables: tuple[str, ...]
    module: TowerModule = TowerModule.IDENTITY
    output_dim: int | None = None
    forward_compression: str = "fp32"
    backward_compression: str = "fp32"

    def __post_init__(self) -> None:
        where = f"tower {self.name!r}"
        object.__setattr__(self, "module", _enum(TowerModule, self.module, f"{where} module"))
        for field in ("forward_compression", "backward_compression"):
            object.__setattr__(
                self, field, _enum(Compression, getattr(self, field), f"{where} {field}")
            )
        object.__setattr__(self, "tables", tuple(self.tables))
        if not self.name:
            raise ConfigError("a tower needs a non-empty name")
        if not self.tables:
            raise ConfigError(f"{where} has no tables; give it at least one or drop it")
        if len(set(self.tables)) != len(self.tables):
            raise ConfigError(f"{where} lists a table twice: {list(self.tables)}")
        if isinstance(self.host, bool) or not isinstance(self.host, int) or self.host < 0:
            raise ConfigError(f"{where}: host must be a non-negative integer, got {self.host!r}")
        if self.module is TowerModule.IDENTITY:
            if self.output_dim is not None:
                raise ConfigError(
                    f"{where}: an identity tower returns its pooled vectors as they are; "
                    f"drop output_dim={self.output_dim} or choose another module"
                )
        elif (
            isinstance(self.output_dim, bool)
            or not isinstance(self.output_dim, int)
            or self.output_dim < 1
        ):
            raise ConfigError(
                f"{where}: a {self.module.value} tower needs output_dim, a positive integer "
                f"(got {self.output_dim!r})"
            )

    @classmethod
    def from_dict(cls, data: Any) -> TowerPlan:
        if not isinstance(data, dict):
            raise ConfigError(f"malformed tower in plan JSON: expected an object, got {data!r}")
        try:
            return cls(**data)
        except TypeError as error:
            raise ConfigError(f"malformed tower in plan JSON: {error}") from error


class PlanParts(Protocol):
    """What the tower rules read of a :class:`~lightning_embark.plan.Plan` (structural, so
    that this module, which the plan imports, does not import it back)."""

    @property
    def towers(self) -> Sequence[TowerPlan]: ...
    @property
    def tables(self) -> Sequence[Any]: ...
    @property
    def clusters(self) -> Sequence[Any]: ...
    @property
    def num_hosts(self) -> int: ...
    @property
    def ranks_per_host(self) -> int: ...


def check_towers(plan: PlanParts) -> None:
    """The plan-only rules of towers (tables, hosts, clusters); raises ConfigError.

    Called by :class:`~lightning_embark.plan.Plan` on construction. Whether each
    tower's blocks sit on its host is checked there too, since layouts name ranks.
    """
    names = [t.name for t in plan.towers]
    if len(set(names)) != len(names):
        raise ConfigError(f"duplicate tower names in plan: {names}")
    planned = {t.table: t for t in plan.tables}
    owner: dict[str, str] = {}
    for tower in plan.towers:
        if tower.host >= plan.num_hosts:
            raise ConfigError(
                f"tower {tower.name!r} is on host {tower.host} but the plan has "
                f"{plan.num_hosts} host(s) (0..{plan.num_hosts - 1})"
            )
        for table in tower.tables:
            if table not in planned:
                raise ConfigError(
                    f"tower {tower.name!r} names table {table!r}, which has no layout in the plan "
                    f"(planned tables: {sorted(planned)})"
                )
            if table in owner:
                raise ConfigError(
                    f"table {table!r} is in towers {owner[table]!r} and {tower.name!r}; a table "
                    "belongs to one tower at most"
                )
            owner[table] = tower.name
            host_ranks = _host_ranks(plan, tower.host)
            layout = planned[table]
            off_host = sorted({r for group in layout.ranks for r in group} - set(host_ranks))
            if off_host:
                raise ConfigError(
                    f"table {table!r} of tower {tower.name!r} has blocks on rank(s) {off_host}, "
                    f"outside the tower's host {tower.host} (ranks {host_ranks[0]}.."
                    f"{host_ranks[-1]}); place every block on that host"
                )
    host_of = {t: next(w.host for w in plan.towers if w.name == o) for t, o in owner.items()}
    for cluster in plan.clusters:
        members = [t.table for t in plan.tables if t.cluster == cluster.name]
        scopes = {host_of.get(t) for t in members}
        if len(scopes) > 1:
            where = ", ".join(
                f"{t} ({'flat' if host_of.get(t) is None else f'tower host {host_of[t]}'})"
                for t in members
            )
            raise ConfigError(
                f"cluster {cluster.name!r} mixes tables of different scopes: {where}; a cluster "
                "holds flat tables only or the tower tables of one host"
            )


def _host_ranks(plan: PlanParts, host: int) -> list[int]:
    return list(range(host * plan.ranks_per_host, (host + 1) * plan.ranks_per_host))


def tower_of(plan: PlanParts, table: str) -> TowerPlan | None:
    """The tower holding ``table``, or None when the table is flat."""
    return next((t for t in plan.towers if table in t.tables), None)
