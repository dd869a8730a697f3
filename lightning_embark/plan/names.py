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
    """What naming needs of a table config (torchrec's ``EmbeddingBagConfig`` has both)."""

    name: str
    feature_names: list[str]


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


def resolve(config: NamedTable, planned: Sequence[str]) -> str:
    """The name under which ``planned`` (a plan's table names) lays the table out.

    Raises:
        ConfigError: no alias of the table is planned; names the plan's tables that
            match no table of the model, since a renamed table is the usual cause.
    """
    for name in aliases(config):
        if name in planned:
            return name
    raise ConfigError(
        f"table {config.name!r} (features {list(config.feature_names)}) is missing from the plan; "
        f"add a layout named {' or '.join(repr(a) for a in aliases(config))} (planned tables: "
        f"{sorted(planned)})"
    )
