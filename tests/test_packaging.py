"""Every package folder is listed in pyproject.toml, so it ships in the wheel."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_folder_is_listed() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    mapped = {folder: name for name, folder in config["package-dir"].items()}
    found = set()
    for init in ROOT.glob("*/**/__init__.py"):
        relative = init.parent.relative_to(ROOT)
        top = relative.parts[0]
        if top in ("tests", "benchmarks", "examples", ".venv", "build"):
            continue
        if top in mapped:
            found.add(".".join([mapped[top], *relative.parts[1:]]))
        else:
            found.add(".".join(relative.parts))
    assert found <= listed, f"add to [tool.setuptools] packages: {sorted(found - listed)}"
    assert listed <= found, f"listed but missing on disk: {sorted(listed - found)}"
