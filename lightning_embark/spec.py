"""Model specs: embedding tables and their access statistics, as torchrec configs.

A spec is a JSON file (the presets in ``lightning_embark/presets/``): a name, an
``id_distribution`` (``uniform`` or ``zipf`` with ``alpha``), ``num_dense_features``
and ``tables``, each with ``name``, ``num_embeddings``, ``embedding_dim`` and
``pooling_factor`` (mean IDs per sample). Row counts can be capped so that
billion-row specs run on a CPU: communication volume depends on batch, hotness
and width, not on the number of rows.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from lightning_embark.errors import ConfigError

if TYPE_CHECKING:
    from torchrec.modules.embedding_configs import EmbeddingBagConfig


class TableShape(Protocol):
    """What a spec needs of a model's table config: torchrec's ``EmbeddingBagConfig`` and
    the engine's ``TableConfig`` both have it."""

    @property
    def name(self) -> str: ...

    @property
    def num_embeddings(self) -> int: ...

    @property
    def embedding_dim(self) -> int: ...


_TABLE_FIELDS = ("name", "num_embeddings", "embedding_dim", "pooling_factor")


@dataclass(frozen=True, kw_only=True)
class IdDistribution:
    """How IDs are drawn within a table: ``uniform`` or ``zipf`` with exponent ``alpha``."""

    kind: str = "uniform"
    alpha: float = 1.1

    def __post_init__(self) -> None:
        if self.kind not in ("uniform", "zipf"):
            raise ConfigError(
                f"id_distribution.kind must be 'uniform' or 'zipf', got {self.kind!r}"
            )
        if self.kind == "zipf" and not self.alpha > 0:
            raise ConfigError(f"id_distribution.alpha must be > 0 for zipf, got {self.alpha!r}")


@dataclass(frozen=True, kw_only=True)
class TableSpec:
    """One embedding table read by one feature of the same name.

    Attributes:
        name: Table name; the feature that reads it has the same name.
        num_embeddings: Rows (after any cap).
        embedding_dim: Row width.
        pooling_factor: Mean IDs per sample (hotness).
        original_num_embeddings: Rows before a cap, for reports.
    """

    name: str
    num_embeddings: int
    embedding_dim: int
    pooling_factor: float
    original_num_embeddings: int | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise ConfigError("table name must be a non-empty string")
        if (
            isinstance(self.num_embeddings, bool)
            or not isinstance(self.num_embeddings, int)
            or self.num_embeddings < 1
        ):
            raise ConfigError(
                f"table {self.name!r}: num_embeddings must be a positive integer, "
                f"got {self.num_embeddings!r}"
            )
        if (
            isinstance(self.embedding_dim, bool)
            or not isinstance(self.embedding_dim, int)
            or self.embedding_dim < 1
        ):
            raise ConfigError(
                f"table {self.name!r}: embedding_dim must be a positive integer, "
                f"got {self.embedding_dim!r}"
            )
        original = self.original_num_embeddings
        if original is not None and (
            isinstance(original, bool) or not isinstance(original, int) or original < 1
        ):
            raise ConfigError(
                f"table {self.name!r}: original_num_embeddings must be a positive integer "
                f"or absent, got {original!r}"
            )
        if not self.pooling_factor > 0:
            raise ConfigError(
                f"table {self.name!r}: pooling_factor must be > 0, got {self.pooling_factor!r}"
            )

    @property
    def feature_name(self) -> str:
        """The feature (KeyedJaggedTensor key) that reads this table."""
        return self.name

    @property
    def capped(self) -> bool:
        """Whether rows were capped below the spec's count."""
        return (
            self.original_num_embeddings is not None
            and self.original_num_embeddings != self.num_embeddings
        )


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """A recommendation model's sparse side plus its dense feature count."""

    name: str
    tables: tuple[TableSpec, ...]
    num_dense_features: int = 13
    id_distribution: IdDistribution = dataclasses.field(default_factory=IdDistribution)
    source: str = ""

    def __post_init__(self) -> None:
        if not self.tables:
            raise ConfigError(f"spec {self.name!r} has no tables")
        names = [t.name for t in self.tables]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ConfigError(f"spec {self.name!r}: duplicate table names {duplicates}")
        if not isinstance(self.num_dense_features, int) or self.num_dense_features < 0:
            raise ConfigError(
                f"spec {self.name!r}: num_dense_features must be a non-negative integer, "
                f"got {self.num_dense_features!r}"
            )

    @property
    def feature_names(self) -> list[str]:
        """Feature keys in table order."""
        return [t.feature_name for t in self.tables]

    @property
    def rows_capped(self) -> bool:
        """Whether any table's rows were capped."""
        return any(t.capped for t in self.tables)

    def capped(self, max_rows: int | None) -> ModelSpec:
        """A copy with every table's rows limited to ``max_rows`` (None: unchanged)."""
        if max_rows is None:
            return self
        if max_rows < 1:
            raise ConfigError(f"max_rows must be >= 1, got {max_rows}")
        tables = tuple(
            dataclasses.replace(
                t,
                num_embeddings=min(t.num_embeddings, max_rows),
                original_num_embeddings=t.original_num_embeddings
                or (t.num_embeddings if t.num_embeddings > max_rows else None),
            )
            for t in self.tables
        )
        return dataclasses.replace(self, tables=tables)

    def describe(self) -> str:
        """One line for logs, saying whether rows were capped."""
        rows = sum(t.num_embeddings for t in self.tables)
        line = f"{self.name}: {len(self.tables)} tables, {rows:,} rows"
        if self.rows_capped:
            original = sum(t.original_num_embeddings or t.num_embeddings for t in self.tables)
            num_capped = sum(t.capped for t in self.tables)
            line += (
                f" (rows capped: {num_capped} tables cut from {original:,} rows in all;"
                " communication volume is unchanged)"
            )
        return line

    def embedding_bag_configs(self) -> list[EmbeddingBagConfig]:
        """torchrec configs, one table per feature, sum pooling."""
        from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType

        return [
            EmbeddingBagConfig(
                name=f"t_{t.name}",
                embedding_dim=t.embedding_dim,
                num_embeddings=t.num_embeddings,
                feature_names=[t.feature_name],
                pooling=PoolingType.SUM,
            )
            for t in self.tables
        ]

    @classmethod
    def from_configs(
        cls,
        configs: Sequence[TableShape],
        *,
        name: str,
        names: Sequence[str] | None = None,
        pooling_factors: Mapping[str, float] | None = None,
    ) -> ModelSpec:
        """The spec of a model's torchrec table configs: the inverse of
        :meth:`embedding_bag_configs`, for planning and for checking plans.

        Args:
            configs: The tables, in model order.
            name: The spec's name.
            names: The tables' plan names (default: each config's own name).
            pooling_factors: Mean IDs per sample by plan name (default 1: unknown).
        """
        names = list(names) if names is not None else [c.name for c in configs]
        factors = pooling_factors or {}
        return cls(
            name=name,
            tables=tuple(
                TableSpec(
                    name=n,
                    num_embeddings=c.num_embeddings,
                    embedding_dim=c.embedding_dim,
                    pooling_factor=factors.get(n, 1.0),
                )
                for n, c in zip(names, configs, strict=True)
            ),
        )

    def to_dict(self) -> dict:
        """JSON form in the shared spec format."""
        return {
            "name": self.name,
            "source": self.source,
            "id_distribution": dataclasses.asdict(self.id_distribution),
            "num_dense_features": self.num_dense_features,
            "tables": [
                {f: getattr(t, f) for f in _TABLE_FIELDS}
                | ({"original_num_embeddings": t.original_num_embeddings} if t.capped else {})
                for t in self.tables
            ],
        }


def preset_names() -> list[str]:
    """Model presets shipped with the package (file stems)."""
    folder = resources.files("lightning_embark") / "presets"
    return sorted(
        p.name.removesuffix(".json") for p in folder.iterdir() if p.name.endswith(".json")
    )


def _integer(value: object, where: str) -> int:
    """A JSON integer field as an int: refuse what would be silently converted.

    ``int("1e9")`` fails with a message naming no file and ``int(1500000000.5)``
    truncates without a word; a spec's counts are exact, so only JSON integers and
    whole JSON numbers (``1e9``, ``1000000000.0``) are taken.
    """
    if isinstance(value, bool):
        raise ConfigError(f"{where} must be an integer, got the boolean {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if math.isfinite(value) and value.is_integer():
            return int(value)
        raise ConfigError(
            f"{where} must be an integer, got {value!r}, which is not a whole number; "
            "values are not rounded: write the integer you mean"
        )
    if isinstance(value, str):
        raise ConfigError(
            f"{where} must be an integer, got the string {value!r}; write it as a JSON "
            "number without quotes (e.g. 1000000000 or 1e9); strings are not converted"
        )
    raise ConfigError(f"{where} must be an integer, got {value!r} ({type(value).__name__})")


def _number(value: object, where: str) -> float:
    """A JSON number field as a float; strings, booleans and non-finite values are refused."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        hint = "; write it as a JSON number without quotes" if isinstance(value, str) else ""
        raise ConfigError(f"{where} must be a number, got {value!r}{hint}")
    if not math.isfinite(value):
        raise ConfigError(f"{where} must be a finite number, got {value!r}")
    return float(value)


def _table_from_dict(table: object, index: int, origin: str) -> TableSpec:
    if not isinstance(table, dict):
        raise ConfigError(
            f"{origin}: table #{index} must be a JSON object with fields "
            f"{list(_TABLE_FIELDS)}, got {table!r}"
        )
    label = table.get("name", f"#{index}")
    for field in _TABLE_FIELDS:
        if field not in table:
            raise ConfigError(f"{origin}: table {label} is missing required field {field!r}")

    def where(field: str) -> str:
        return f"{origin}: table {label!r}: field {field!r}"

    original = table.get("original_num_embeddings")
    try:
        return TableSpec(
            name=str(table["name"]),
            num_embeddings=_integer(table["num_embeddings"], where("num_embeddings")),
            embedding_dim=_integer(table["embedding_dim"], where("embedding_dim")),
            pooling_factor=_number(table["pooling_factor"], where("pooling_factor")),
            original_num_embeddings=None
            if original is None
            else _integer(original, where("original_num_embeddings")),
        )
    except ConfigError as error:
        if str(error).startswith(origin):
            raise
        raise ConfigError(f"{origin}: {error}") from error


def spec_from_dict(data: dict, *, origin: str = "<dict>") -> ModelSpec:
    """Build a spec from its JSON form.

    Every error names ``origin`` (the file or preset), the table and the field.
    Integer fields take JSON integers or whole JSON numbers (``1e9``); strings and
    fractions are refused rather than converted or truncated.
    """
    if not isinstance(data, dict):
        raise ConfigError(f"{origin}: a spec must be a JSON object, got {type(data).__name__}")
    for field in ("name", "tables"):
        if field not in data:
            raise ConfigError(f"{origin}: spec is missing required field {field!r}")
    if not isinstance(data["tables"], list):
        raise ConfigError(
            f"{origin}: field 'tables' must be a list of table objects, got {data['tables']!r}"
        )
    tables = [_table_from_dict(t, i, origin) for i, t in enumerate(data["tables"])]
    dist = data.get("id_distribution", {"kind": "uniform"})
    if not isinstance(dist, dict):
        raise ConfigError(
            f"{origin}: field 'id_distribution' must be an object such as "
            f'{{"kind": "zipf", "alpha": 1.1}}, got {dist!r}'
        )
    try:
        return ModelSpec(
            name=str(data["name"]),
            tables=tuple(tables),
            num_dense_features=_integer(
                data.get("num_dense_features", 13), f"{origin}: field 'num_dense_features'"
            ),
            id_distribution=IdDistribution(
                kind=dist.get("kind", "uniform"),
                alpha=_number(dist.get("alpha", 1.1), f"{origin}: field 'id_distribution.alpha'"),
            ),
            source=str(data.get("source", "")),
        )
    except ConfigError as error:
        if str(error).startswith(origin):
            raise
        raise ConfigError(f"{origin}: {error}") from error


def load_spec(path_or_preset: str | Path, *, max_rows: int | None = None) -> ModelSpec:
    """Load a spec from a JSON file or a preset name, optionally capping rows.

    Raises:
        ConfigError: the file does not exist and the name is not a preset (the message
            lists the presets), the JSON is invalid, a field is missing, or a value is
            of the wrong kind or out of range (file, table and field named).
    """
    path = Path(path_or_preset)
    if path.suffix == ".json" or path.exists():
        if not path.is_file():
            raise ConfigError(f"model spec file {str(path)!r} does not exist")
        text = path.read_text()
        origin = str(path)
    else:
        name = str(path_or_preset)
        if name not in preset_names():
            raise ConfigError(
                f"unknown model preset {name!r}: not a file either; "
                f"known presets: {preset_names()}"
            )
        text = (resources.files("lightning_embark") / "presets" / f"{name}.json").read_text()
        origin = f"preset {name}"
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise ConfigError(f"{origin}: invalid JSON ({error})") from error
    return spec_from_dict(data, origin=origin).capped(max_rows)
