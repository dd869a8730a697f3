"""``towers.json``: tower requests as a file (what the partitioner writes, what the
strategy and ``embark-plan`` read).

Format (version 1)::

    {
        "version": 1,
        "towers": [
            {
                "name": "tower0",
                "tables": ["f0", "f3"],
                "host": 0,
                "module": "projection",
                "output_ratio": 4,
                "forward_compression": "fp16",
                "backward_compression": "fp16",
            },
            ...,
        ],
    }

``host``, ``module`` (default ``identity``), ``output_dim`` / ``output_ratio`` and the
compressions are optional per tower; anything else in a tower is refused by name.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lightning_embark.errors import ConfigError
from lightning_embark.plan._tower_requests import TowerRequest

TOWERS_VERSION = 1
_FIELDS = tuple(f.name for f in dataclasses.fields(TowerRequest))


def towers_to_dict(towers: Sequence[TowerRequest]) -> dict[str, Any]:
    """The JSON document of ``towers`` (defaults left out)."""
    default = {f.name: f.default for f in dataclasses.fields(TowerRequest)}
    items = []
    for tower in towers:
        item: dict[str, Any] = {}
        for name in _FIELDS:
            value = getattr(tower, name)
            if name in ("name", "tables") or value != default[name]:
                item[name] = list(value) if name == "tables" else getattr(value, "value", value)
        items.append(item)
    return {"version": TOWERS_VERSION, "towers": items}


def save_towers(towers: Sequence[TowerRequest], path: str | Path) -> None:
    Path(path).write_text(json.dumps(towers_to_dict(towers), indent=2))


def towers_from_dict(data: Any, *, origin: str = "<dict>") -> list[TowerRequest]:
    """Tower requests from a ``towers.json`` document.

    Raises:
        ConfigError: naming ``origin``, the tower and the field that is wrong.
    """
    if not isinstance(data, dict) or not isinstance(data.get("towers"), list):
        raise ConfigError(f"{origin}: expected an object with a 'towers' list, got {data!r:.80}")
    if data.get("version", TOWERS_VERSION) != TOWERS_VERSION:
        raise ConfigError(
            f"{origin}: towers file version {data.get('version')!r} is not supported; this "
            f"build reads version {TOWERS_VERSION}"
        )
    out = []
    for index, item in enumerate(data["towers"]):
        where = f"{origin}: tower {index}"
        if not isinstance(item, dict):
            raise ConfigError(f"{where} must be an object, got {item!r}")
        unknown = sorted(set(item) - set(_FIELDS))
        if unknown:
            raise ConfigError(f"{where} has unknown field(s) {unknown}; known: {sorted(_FIELDS)}")
        if "name" not in item or "tables" not in item:
            raise ConfigError(f"{where} needs 'name' and 'tables'")
        try:
            out.append(TowerRequest(**item))
        except (ConfigError, ValueError, TypeError) as error:
            raise ConfigError(f"{where} ({item.get('name')!r}): {error}") from error
    return out


def load_towers(path: str | Path) -> list[TowerRequest]:
    """Tower requests from a ``towers.json`` file (errors name the file)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ConfigError(f"cannot read towers file {str(path)!r}: {error}") from error
    return towers_from_dict(data, origin=str(path))
