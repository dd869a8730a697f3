"""The sharding plan: embedding clusters and every table's 3D layout, as versioned JSON.

A table's layout is ``(r, k, c)``: ``r`` replica groups, ``k`` row shards, ``c``
column shards. Its ``k * c`` blocks (block ``i * c + j`` holds row shard ``i`` and
column shard ``j``) are placed on ranks once per replica group. Requester rank ``q``
is served by replica group ``q * r // world_size``, so replica groups split the
world into contiguous blocks (``r = num_hosts`` gives one replica per host). Row
shard of an ID: ``id % k`` (``hash``) or the contiguous range it falls in (``range``).
Data-parallel tables are the special case ``r = world_size, k = c = 1`` in a DP
cluster.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightning_embark.errors import ConfigError, PlanInfeasibleError
from lightning_embark.plan._cache import check_cache_load_factor, hbm_block_bytes, is_cached
from lightning_embark.plan._kinds import ClusterType, Compression, RowSplit, _enum, _rank
from lightning_embark.plan._tower_choice import TowerChoice
from lightning_embark.plan._towers import TowerPlan, check_towers, tower_of
from lightning_embark.spec import ModelSpec
from lightning_embark.topology import Topology

#: Version 2 added towers; version 1 plans (no towers) still load.
PLAN_VERSION = 2
_READABLE_VERSIONS = (1, 2)
#: Fields left out of the JSON when None.
_OPTIONAL = ("cache_load_factor", "tower_choice")


@dataclass(frozen=True, kw_only=True)
class ClusterPlan:
    """One embedding cluster: one exchange strategy and one compression setting."""

    name: str
    type: ClusterType
    forward_compression: Compression = Compression.FP32
    backward_compression: Compression = Compression.FP32
    hierarchical: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "type", _enum(ClusterType, self.type, f"cluster {self.name!r} type")
        )
        for field in ("forward_compression", "backward_compression"):
            object.__setattr__(
                self,
                field,
                _enum(Compression, getattr(self, field), f"cluster {self.name!r} {field}"),
            )
        if self.type is ClusterType.DP and (
            self.forward_compression is not Compression.FP32
            or self.backward_compression is not Compression.FP32
            or self.hierarchical
        ):
            raise ConfigError(
                f"cluster {self.name!r}: DP clusters have no forward exchange and all-reduce "
                "their gradients in fp32; use forward_compression='fp32', "
                "backward_compression='fp32' and hierarchical=False"
            )


@dataclass(frozen=True, kw_only=True)
class TableLayout:
    """Where one table lives.

    Attributes:
        table: Table name (the spec's, which is also its feature's name).
        cluster: Name of the cluster that exchanges it.
        num_replicas: ``r``, replica groups.
        num_row_shards: ``k``, row shards per replica.
        num_col_shards: ``c``, column shards per replica (must divide the width).
        row_split: How IDs map to row shards.
        ranks: ``ranks[g][i * c + j]`` is the rank holding row shard ``i``, column
            shard ``j`` of replica group ``g``.
        cache_load_factor: None (the default; also 1): the table's blocks live wholly in
            HBM. A value in ``(0, 1)``: they live in unified (host) memory with an HBM
            cache of that share of their rows (fbgemm's ``MANAGED_CACHING``), so a table
            larger than its ranks' HBM still trains; the planner sets it only on GPU
            hardware whose blocks do not fit, and prices the cache's misses. Plans
            written before it existed load as None.
    """

    table: str
    cluster: str
    num_replicas: int = 1
    num_row_shards: int = 1
    num_col_shards: int = 1
    row_split: RowSplit = RowSplit.HASH
    ranks: tuple[tuple[int, ...], ...]
    cache_load_factor: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "row_split", _enum(RowSplit, self.row_split, f"table {self.table!r} row_split")
        )
        object.__setattr__(
            self,
            "cache_load_factor",
            check_cache_load_factor(self.cache_load_factor, f"table {self.table!r}"),
        )
        object.__setattr__(
            self,
            "ranks",
            tuple(tuple(_rank(r, self.table) for r in group) for group in self.ranks),
        )
        for field in ("num_replicas", "num_row_shards", "num_col_shards"):
            if getattr(self, field) < 1:
                raise ConfigError(
                    f"table {self.table!r}: {field} must be >= 1, got {getattr(self, field)}"
                )
        if len(self.ranks) != self.num_replicas:
            raise ConfigError(
                f"table {self.table!r}: {len(self.ranks)} rank groups given for "
                f"{self.num_replicas} replicas; give one group per replica"
            )
        blocks = self.num_row_shards * self.num_col_shards
        for group, ranks in enumerate(self.ranks):
            if len(ranks) != blocks:
                raise ConfigError(
                    f"table {self.table!r}: replica {group} places {len(ranks)} blocks but "
                    f"k*c = {self.num_row_shards}*{self.num_col_shards} = {blocks}"
                )

    def replica_of(self, rank: int, world_size: int) -> int:
        """The replica group that serves requester ``rank``."""
        return rank * self.num_replicas // world_size

    def row_range(self, row_shard: int, num_rows: int) -> tuple[int, int]:
        """Contiguous ``[start, end)`` of a range row shard (balanced, earlier shards larger)."""
        base, extra = divmod(num_rows, self.num_row_shards)
        start = row_shard * base + min(row_shard, extra)
        return start, start + base + (1 if row_shard < extra else 0)

    def shard_rows(self, row_shard: int, num_rows: int) -> int:
        """Rows held by one row shard."""
        if self.row_split is RowSplit.RANGE:
            start, end = self.row_range(row_shard, num_rows)
            return end - start
        return len(range(row_shard, num_rows, self.num_row_shards))


@dataclass(frozen=True, kw_only=True)
class Plan:
    """Clusters plus a layout for every table, and towers; serialisable and checkable.

    Attributes:
        world_size: Ranks the plan runs on.
        ranks_per_host: Ranks per host (hierarchical exchanges and towers).
        clusters: The embedding clusters.
        tables: One layout per table.
        towers: Towers (DMT, :mod:`._towers`): tables kept on one host, with the module
            that runs there; tables in no tower are flat.
        tower_choice: Why the plan has these towers or none, when the planner decided
            (``towers="auto"``, :mod:`._tower_choice`); None otherwise.
        version: The JSON format's version (read: 1 and 2; written: 2).
    """

    world_size: int
    ranks_per_host: int
    clusters: tuple[ClusterPlan, ...]
    tables: tuple[TableLayout, ...]
    towers: tuple[TowerPlan, ...] = ()
    tower_choice: TowerChoice | None = None
    version: int = PLAN_VERSION

    def __post_init__(self) -> None:
        if self.version not in _READABLE_VERSIONS:
            raise ConfigError(
                f"plan version {self.version} is not supported; this build reads versions "
                f"{list(_READABLE_VERSIONS)}"
            )
        if self.version == 1 and self.towers:
            raise ConfigError("plan version 1 has no towers; write towers with version 2")
        object.__setattr__(self, "version", PLAN_VERSION)
        object.__setattr__(self, "towers", tuple(self.towers))
        if self.world_size < 1 or self.ranks_per_host < 1 or self.world_size % self.ranks_per_host:
            raise ConfigError(
                f"plan world_size {self.world_size} must be a positive multiple of ranks_per_host "
                f"{self.ranks_per_host}"
            )
        names = [c.name for c in self.clusters]
        if len(set(names)) != len(names):
            raise ConfigError(f"duplicate cluster names in plan: {names}")
        tables = [t.table for t in self.tables]
        if len(set(tables)) != len(tables):
            raise ConfigError(f"a table has more than one layout in the plan: {tables}")
        check_towers(self)

    def tower_of(self, table: str) -> TowerPlan | None:
        """The tower holding ``table``, or None when it is flat."""
        return tower_of(self, table)

    @property
    def num_hosts(self) -> int:
        return self.world_size // self.ranks_per_host

    def cluster(self, name: str) -> ClusterPlan:
        for cluster in self.clusters:
            if cluster.name == name:
                return cluster
        raise ConfigError(
            f"plan has no cluster {name!r}; clusters: {[c.name for c in self.clusters]}"
        )

    def layout(self, table: str) -> TableLayout:
        for layout in self.tables:
            if layout.table == table:
                return layout
        raise ConfigError(
            f"table {table!r} is missing from the plan; add a layout for it "
            f"(planned tables: {[t.table for t in self.tables]})"
        )

    def validate(
        self,
        spec: ModelSpec,
        topology: Topology | None = None,
        *,
        bytes_per_row_element: float = 4.0,
    ) -> None:
        """Prove the plan executes ``spec`` on ``topology``.

        Checks that every table is planned exactly once and covered once per replica
        group, that ranks exist, column splits divide widths, DP tables are replicated
        on every rank (and not cached), and (when the topology gives memory per rank)
        that each rank's weights and optimizer state fit; a cached block
        (``cache_load_factor`` below 1) counts its HBM cache and cache metadata
        (:func:`~lightning_embark.plan._cache.hbm_block_bytes`), not its rows in UVM.

        Args:
            spec: The model whose tables must be covered.
            topology: The cluster; its shape must match the plan's.
            bytes_per_row_element: Bytes per stored element including optimizer
                state (4 for fp32 weights with SGD or a row-wise Adagrad accumulator).

        Raises:
            ConfigError: naming the table and what is wrong with its layout.
            PlanInfeasibleError: a rank's blocks do not fit its memory (names the rank,
                its largest table and the shortfall).
        """
        if topology is not None and topology.world_size != self.world_size:
            raise ConfigError(
                f"plan is for {self.world_size} ranks but the topology has {topology.world_size} "
                f"({topology.num_hosts} hosts x {topology.ranks_per_host}); re-plan for this "
                "world size"
            )
        if topology is not None and topology.ranks_per_host != self.ranks_per_host:
            raise ConfigError(
                f"plan assumes {self.ranks_per_host} ranks per host but the topology has "
                f"{topology.ranks_per_host}"
            )
        spec_tables = {t.name: t for t in spec.tables}
        extra = sorted({t.table for t in self.tables} - set(spec_tables))
        if extra:
            raise ConfigError(f"plan lays out tables not in spec {spec.name!r}: {extra}")
        memory = [0.0] * self.world_size
        largest: list[tuple[float, str]] = [
            (0.0, "")
        ] * self.world_size  # per rank: its largest block
        for table in spec.tables:
            layout = self.layout(table.name)
            cluster = self.cluster(layout.cluster)
            if table.embedding_dim % layout.num_col_shards:
                raise ConfigError(
                    f"table {table.name!r}: {layout.num_col_shards} column shards do not divide "
                    f"embedding_dim {table.embedding_dim}"
                )
            if layout.num_row_shards > table.num_embeddings:
                raise ConfigError(
                    f"table {table.name!r}: {layout.num_row_shards} row shards for only "
                    f"{table.num_embeddings} rows"
                )
            # A DP table is replicated on every rank that looks it up: the world, or the
            # ranks of its tower's host.
            tower = self.tower_of(table.name)
            scope = self.world_size if tower is None else self.ranks_per_host
            if cluster.type is ClusterType.DP and (
                layout.num_replicas != scope or layout.num_row_shards * layout.num_col_shards != 1
            ):
                where = "" if tower is None else f" (in tower {tower.name!r}: its host's ranks)"
                raise ConfigError(
                    f"table {table.name!r} is in DP cluster {cluster.name!r} but its layout is "
                    f"(r={layout.num_replicas}, k={layout.num_row_shards}, "
                    f"c={layout.num_col_shards}); DP needs (r={scope}, k=1, c=1){where}"
                )
            if cluster.type is ClusterType.DP and is_cached(layout.cache_load_factor):
                raise ConfigError(
                    f"table {table.name!r} is in DP cluster {cluster.name!r} with "
                    f"cache_load_factor={layout.cache_load_factor}; DP replicas are dense "
                    "in HBM (their gradients are all-reduced whole): drop the factor or "
                    "shard the table in an RB or UB cluster"
                )
            if layout.num_replicas > self.world_size:
                raise ConfigError(
                    f"table {table.name!r}: {layout.num_replicas} replicas for {self.world_size} "
                    "ranks"
                )
            col_width = table.embedding_dim // layout.num_col_shards
            for group, ranks in enumerate(layout.ranks):
                for block, rank in enumerate(ranks):
                    if not 0 <= rank < self.world_size:
                        raise ConfigError(
                            f"table {table.name!r}: replica {group} block {block} is on rank "
                            f"{rank}, outside a world of {self.world_size}"
                        )
                    rows = layout.shard_rows(block // layout.num_col_shards, table.num_embeddings)
                    size = hbm_block_bytes(
                        rows,
                        col_width,
                        layout.cache_load_factor,
                        element_bytes=bytes_per_row_element,
                    )
                    memory[rank] += size
                    largest[rank] = max(largest[rank], (size, table.name))
        if topology is not None and topology.memory_per_rank is not None:
            for rank, used in enumerate(memory):
                if used > topology.memory_per_rank:
                    table_name = largest[rank][1]
                    tower = self.tower_of(table_name)
                    where = (
                        ""
                        if tower is None
                        else f" of tower {tower.name!r}, which must fit host {tower.host}"
                    )
                    raise PlanInfeasibleError(
                        f"rank {rank} needs {used / 2**30:.2f} GiB for its embedding shards but "
                        f"has {topology.memory_per_rank / 2**30:.2f} GiB (short by "
                        f"{(used - topology.memory_per_rank) / 2**30:.2f} GiB; its largest block "
                        f"is of table {table_name!r}{where}); split or spread its tables",
                        table=table_name,
                        shortfall_bytes=used - topology.memory_per_rank,
                    )

    def to_dict(self) -> dict[str, Any]:
        def plain(obj: Any) -> Any:
            if isinstance(obj, enum.Enum):
                return obj.value
            if isinstance(obj, tuple | list):
                return [plain(x) for x in obj]
            if dataclasses.is_dataclass(obj):
                # An uncached table writes no cache_load_factor, a plan without a tower
                # choice none: such plans keep the JSON they had before the fields existed.
                return {
                    f.name: plain(getattr(obj, f.name))
                    for f in dataclasses.fields(obj)
                    if not (f.name in _OPTIONAL and getattr(obj, f.name) is None)
                }
            return obj

        return plain(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Plan:
        if not isinstance(data, dict):
            raise ConfigError(
                "malformed plan JSON: expected an object with world_size, ranks_per_host, "
                f"clusters, tables and optionally towers, got a {type(data).__name__}"
            )
        try:
            return cls(
                version=data.get("version", PLAN_VERSION),
                world_size=data["world_size"],
                ranks_per_host=data["ranks_per_host"],
                clusters=tuple(ClusterPlan(**c) for c in data["clusters"]),
                tables=tuple(TableLayout(**t) for t in data["tables"]),
                towers=tuple(TowerPlan.from_dict(t) for t in data.get("towers", ())),
                tower_choice=(
                    None
                    if data.get("tower_choice") is None
                    else TowerChoice.from_dict(data["tower_choice"])
                ),
            )
        except (KeyError, TypeError) as error:
            raise ConfigError(f"malformed plan JSON: {error}") from error

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2))

    @classmethod
    def load(cls, path: str | Path) -> Plan:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as error:
            raise ConfigError(f"cannot read plan {str(path)!r}: {error}") from error
        if (
            isinstance(data, dict) and "plan" in data
        ):  # a document holding a plan (embark-plan --out)
            data = data["plan"]
        try:
            return cls.from_dict(data)
        except ConfigError as error:
            raise ConfigError(f"plan {str(path)!r}: {error}") from error
