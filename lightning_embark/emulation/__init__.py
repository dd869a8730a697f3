"""Emulated hosts: network namespaces joined by ``tc``-shaped veth links (``embark-cluster``).

One machine plays H hosts so that intra-host (loopback, fast)
and inter-host (shaped veth, slow) links differ as NVLink and a NIC do. Without root
or iproute2 the same jobs run on plain loopback and say so.
"""

from lightning_embark.emulation._config import (
    DEFAULT_NAME_PREFIX,
    DEFAULT_RATE_MBIT,
    DEFAULT_SUBNET,
    EmulationConfig,
)
from lightning_embark.emulation._hosts import EmulatedHosts, EmulationFallbackWarning
from lightning_embark.emulation._launch import (
    QUIET_RANK_ENV,
    HostLaunch,
    free_loopback_port,
    run_job,
    torchrun_argv,
)
from lightning_embark.emulation._measure import LinkMeasurement, measure_link, measure_pair
from lightning_embark.emulation._netns import (
    cleanup_stale,
    delete_namespace,
    kept_namespaces,
    list_namespaces,
)
from lightning_embark.emulation._procs import sigterm_raises
from lightning_embark.emulation._state import (
    DEFAULT_STATE_DESCRIPTION,
    STATE_ENV,
    attach_hosts,
    default_state_file,
    hosts_state,
    read_state,
    recorded_namespaces,
    state_alive,
    state_remains,
    write_state,
)

__all__ = [
    "DEFAULT_NAME_PREFIX",
    "DEFAULT_RATE_MBIT",
    "DEFAULT_STATE_DESCRIPTION",
    "DEFAULT_SUBNET",
    "QUIET_RANK_ENV",
    "STATE_ENV",
    "EmulatedHosts",
    "EmulationConfig",
    "EmulationFallbackWarning",
    "HostLaunch",
    "LinkMeasurement",
    "attach_hosts",
    "cleanup_stale",
    "default_state_file",
    "delete_namespace",
    "free_loopback_port",
    "hosts_state",
    "kept_namespaces",
    "list_namespaces",
    "measure_link",
    "measure_pair",
    "read_state",
    "recorded_namespaces",
    "run_job",
    "sigterm_raises",
    "state_alive",
    "state_remains",
    "torchrun_argv",
    "write_state",
]
