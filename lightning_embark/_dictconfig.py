"""The one config mechanism: kw-only dataclasses validated in ``__post_init__``.

:class:`DictConfig` gives every config the same JSON round trip, with unknown or
missing keys reported by name instead of as a bare ``TypeError``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Self

from lightning_embark.errors import ConfigError


class DictConfig:
    """Mixin for config dataclasses: ``to_dict`` and its strict inverse ``from_dict``."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        """Inverse of :meth:`to_dict`; unknown or missing fields are a ConfigError."""
        names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        unknown = sorted(set(data) - names)
        if unknown:
            raise ConfigError(
                f"unknown {cls.__name__} fields {unknown}; known fields: {sorted(names)}"
            )
        try:
            return cls(**data)
        except TypeError as error:
            raise ConfigError(f"malformed {cls.__name__}: {error}") from error
