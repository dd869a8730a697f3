"""The cluster state file: one per user by default, overridable, written privately."""

from __future__ import annotations

import stat
import tempfile
from pathlib import Path

import pytest

from lightning_embark.emulation import _state as state_module
from lightning_embark.emulation import default_state_file, read_state, write_state


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    for name in ("EMBARK_CLUSTER_STATE", "XDG_RUNTIME_DIR", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return tmp_path


def test_the_default_state_file_is_per_user_and_never_the_shared_temp_folder(
    clean_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = clean_env / "home"
    assert default_state_file() == home / ".cache" / "lightning-embark" / "embark-cluster.json"
    monkeypatch.setenv("XDG_CACHE_HOME", str(clean_env / "cache"))
    assert default_state_file() == clean_env / "cache" / "lightning-embark" / "embark-cluster.json"
    runtime = clean_env / "run-user"
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    assert default_state_file().parent.parent == clean_env / "cache"  # not a folder: ignored
    runtime.mkdir()
    assert default_state_file() == runtime / "lightning-embark" / "embark-cluster.json"
    monkeypatch.setenv("EMBARK_CLUSTER_STATE", str(clean_env / "mine.json"))
    assert default_state_file() == clean_env / "mine.json"
    assert Path(tempfile.gettempdir()) / "embark-cluster.json" != default_state_file()
    assert "$XDG_RUNTIME_DIR" in state_module.DEFAULT_STATE_DESCRIPTION


def test_write_state_creates_a_private_folder_and_reads_back(clean_env: Path) -> None:
    path = default_state_file()
    write_state(path, {"name": "c", "mode": "loopback"})
    assert read_state(path) == {"name": "c", "mode": "loopback"}
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no partial file left
