"""Recording a running cluster in a small JSON file, so other commands can use it.

``embark-cluster up`` exits while its cluster keeps running; ``run --attach`` and
``down`` (possibly from another shell) find it through this file.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

from lightning_embark.emulation import _netns as netns
from lightning_embark.emulation._config import EmulationConfig
from lightning_embark.emulation._hosts import EmulatedHosts
from lightning_embark.errors import EmulationError

STATE_ENV = "EMBARK_CLUSTER_STATE"
DEFAULT_STATE_FILE = "/tmp/embark-cluster.json"


def default_state_file() -> Path:
    """``$EMBARK_CLUSTER_STATE``, else ``/tmp/embark-cluster.json``."""
    return Path(os.environ.get(STATE_ENV, DEFAULT_STATE_FILE))


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
    """Whether the recorded cluster still exists (a loopback one holds nothing)."""
    if not state or state.get("mode") != "netns" or netns.netns_unavailable_reason() is not None:
        return False
    return state.get("switch") in netns.list_namespaces()


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
                "up`"
            )
    cluster.owned = False
    cluster._up = True
    return cluster
