"""Recording a running cluster in a small JSON file, so other commands can use it.

``embark-cluster up`` exits while its cluster keeps running; ``run --attach`` and
``down`` (possibly from another shell) find it through this file.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import lightning_embark.emulation._netns as netns
from lightning_embark.emulation._config import EmulationConfig
from lightning_embark.emulation._hosts import EmulatedHosts
from lightning_embark.errors import EmulationError

STATE_ENV = "EMBARK_CLUSTER_STATE"
STATE_NAME = "lightning-embark/embark-cluster.json"
#: How the help text and the docs describe :func:`default_state_file`.
DEFAULT_STATE_DESCRIPTION = (
    f"${STATE_ENV}, else $XDG_RUNTIME_DIR/{STATE_NAME}, else ~/.cache/{STATE_NAME}"
)


def default_state_file() -> Path:
    """Where ``embark-cluster up`` records its cluster unless told otherwise.

    ``$EMBARK_CLUSTER_STATE`` if set; else under ``$XDG_RUNTIME_DIR`` (the user's
    own runtime folder, emptied at logout and reboot like the namespaces the file
    describes); else under ``$XDG_CACHE_HOME`` or ``~/.cache``. Always per user: one
    file in the shared temp folder would let one user's ``down`` remove another's
    cluster, and be writable by anybody.
    """
    explicit = os.environ.get(STATE_ENV)
    if explicit:
        return Path(explicit)
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and Path(runtime).is_dir():
        return Path(runtime) / STATE_NAME
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / STATE_NAME


def write_state(path: Path, state: dict) -> None:
    """Write ``state`` to ``path`` (its folder created private to the user), atomically."""
    path = Path(path)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    partial.write_text(json.dumps(state, indent=2) + "\n")
    partial.replace(path)


def recorded_namespaces(state: dict) -> list[str]:
    """The namespaces a recorded netns cluster consists of: hosts, then the switch."""
    if state.get("mode") != "netns":
        return []
    return [*(h["namespace"] for h in state.get("hosts", [])), state["switch"]]


def hosts_state(cluster: EmulatedHosts) -> dict:
    """JSON-ready description of ``cluster``, enough for :func:`attach_hosts`."""
    return {
        "name": cluster.name,
        "mode": cluster.mode,
        "fallback_reason": cluster.fallback_reason,
        "config": cluster.config.to_dict(),
        "switch": cluster.switch,
        "hosts": [dataclasses.asdict(h) for h in cluster.hosts],
        "pid": os.getpid(),
        "describe": cluster.describe(),
    }


def read_state(path: Path) -> dict | None:
    """The recorded state, or None when the file is missing or unreadable."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def state_alive(state: dict | None) -> bool:
    """Whether the recorded cluster still exists whole (a loopback one holds nothing)."""
    if not state or state.get("mode") != "netns" or netns.netns_unavailable_reason() is not None:
        return False
    present = set(netns.list_namespaces())
    return all(ns in present for ns in recorded_namespaces(state))


def state_remains(state: dict | None) -> list[str]:
    """The recorded cluster's namespaces that still exist, when it is not whole.

    A cluster that lost some of its namespaces (deleted by hand, a failed ``down``)
    cannot run jobs; what is left of it only holds addresses and processes.
    """
    if not state or state_alive(state) or netns.netns_unavailable_reason() is not None:
        return []
    present = set(netns.list_namespaces())
    return [ns for ns in recorded_namespaces(state) if ns in present]


def attach_hosts(state: dict | str | Path) -> EmulatedHosts:
    """A handle on a running cluster created elsewhere (``embark-cluster up``).

    The handle can ``run`` jobs; its ``down()`` leaves the cluster alone unless
    ``owned`` is set to True.

    Raises:
        EmulationError: The state cannot be read or its namespaces are gone.
    """
    if not isinstance(state, dict):
        path, read = state, read_state(Path(state))
        if read is None:
            raise EmulationError(
                f"cannot read cluster state {path}; is a cluster up (`embark-cluster up`)?"
            )
        state = read
    cluster = EmulatedHosts(
        EmulationConfig.from_dict(state["config"]), force_loopback=state["mode"] == "loopback"
    )
    cluster.fallback_reason = state["fallback_reason"]
    cluster.name, cluster.switch = state["name"], state["switch"]
    cluster.hosts = [netns.HostNet(**h) for h in state["hosts"]]
    if cluster.mode == "netns":
        missing = sorted({h.namespace for h in cluster.hosts} - set(netns.list_namespaces()))
        if missing:
            raise EmulationError(
                f"cluster {cluster.name} is gone (no namespaces {missing}); run `embark-cluster "
                "down` to remove what is left of it and its state, then `embark-cluster up`"
            )
    cluster.owned = False
    cluster._up = True
    return cluster
