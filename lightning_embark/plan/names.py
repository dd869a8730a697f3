"""How a plan names a model's tables: one rule for plans written by hand and by planners.

A plan names tables by the spec's names (``"f0"``). torchrec configs built from a spec
(:meth:`~lightning_embark.spec.ModelSpec.embedding_bag_configs`) are called ``"t_f0"``
and read feature ``"f0"``; a user's own model names its tables as it likes. So a
table's *plan name* is its torchrec name without the ``t_`` prefix when that is its one
feature's name, else its torchrec name (:func:`plan_name`: what automatic plans write),
and a plan may also name a table by its torchrec name, by that name without ``t_``, or
by its first feature (:func:`aliases`), so plans written for a spec apply to its model.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from lightning_embark.errors import ConfigError


class NamedTable(Protocol):
    """What naming needs of a table config (torchrec's ``EmbeddingBagConfig`` and the
    engine's ``TableConfig`` have both)."""

    @property
    def name(self) -> str: ...

    @property
    def feature_names(self) -> Sequence[str]: ...


def plan_name(config: NamedTable) -> str:
    """The name a plan made here gives a table (``t_f0`` reading ``f0`` -> ``f0``)."""
    stripped = config.name.removeprefix("t_")
    return stripped if list(config.feature_names) == [stripped] else config.name


def aliases(config: NamedTable) -> list[str]:
    """Every name a plan may give the table, :func:`plan_name` first, without repeats."""
    names = [
        plan_name(config),
        config.name,
        config.name.removeprefix("t_"),
        *config.feature_names[:1],
    ]
    return list(dict.fromkeys(names))


def unmatched(planned: Sequence[str], model: Sequence[NamedTable]) -> list[str]:
    """The plan's table names that are no alias of any of ``model``'s tables, sorted.

    When a model table is missing from a plan, these are the usual suspects: the
    same table under an old or a mistyped name.
    """
    known = {alias for config in model for alias in aliases(config)}
    return sorted(dict.fromkeys(name for name in planned if name not in known))


def _missing(config: NamedTable) -> str:
    named = " or ".join(repr(a) for a in aliases(config))
    return (
        f"table {config.name!r} (features {list(config.feature_names)}) is missing from the "
        f"plan; add a layout named {named}"
    )


def _suspects(planned: Sequence[str], model: Sequence[NamedTable] | None) -> str:
    if model is None:
        return f" (planned tables: {sorted(planned)})"
    strangers = unmatched(planned, model)
    if not strangers:
        return f" (every planned table is another table of the model: {sorted(planned)})"
    return (
        f"; the plan's tables that match no table of the model: {strangers} (if one of them "
        "is this table under another name, rename its layout)"
    )


def resolve(
    config: NamedTable, planned: Sequence[str], *, model: Sequence[NamedTable] | None = None
) -> str:
    """The name under which ``planned`` (a plan's table names) lays the table out.

    Args:
        config: The model's table.
        planned: The plan's table names.
        model: All of the model's tables; when given, the error names the plan's
            tables that match none of them instead of listing every planned table.

    Raises:
        ConfigError: no alias of the table is planned; names the aliases a layout
            may use and the plan's tables that match no table of the model, since a
            renamed table is the usual cause.
    """
    for name in aliases(config):
        if name in planned:
            return name
    raise ConfigError(_missing(config) + _suspects(planned, model))


def resolve_all(model: Sequence[NamedTable], planned: Sequence[str]) -> list[str]:
    """:func:`resolve` for every table of ``model``, with one error naming every miss.

    Raises:
        ConfigError: some tables are missing from the plan; the message names each
            with the names its layout may have, and the plan's tables that match no
            table of the model.
    """
    found: list[str] = []
    missing: list[NamedTable] = []
    for config in model:
        hits = [a for a in aliases(config) if a in planned]
        if hits:
            found.append(hits[0])
        else:
            missing.append(config)
    if missing:
        raise ConfigError("; ".join(_missing(c) for c in missing) + _suspects(planned, model))
    return found
