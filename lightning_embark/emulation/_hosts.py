"""The emulated multi-host cluster: create it, run torchrun jobs on it, remove it.

One machine plays H hosts (docs/architecture.md#the-emulated-cluster) so that the
difference between intra-host (fast) and inter-host (slow) links, which the planner and
the towers exploit, is real in every measurement. Where namespaces are not available the
same job runs on plain loopback and every label says it is NOT emulated.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import os
import sys
import warnings
from types import TracebackType

import lightning_embark.emulation._netns as netns
from lightning_embark.emulation._config import EmulationConfig
from lightning_embark.emulation._launch import (
    HostLaunch,
    free_loopback_port,
    rank_env,
    run_job,
    torchrun_argv,
)
from lightning_embark.emulation._procs import signals_deferred, sigterm_raises
from lightning_embark.errors import ConfigError, EmulationError

FORCE_LOOPBACK_ENV = "EMBARK_CLUSTER_FORCE_LOOPBACK"
NETNS_MASTER_PORT = 29500  # every host namespace starts with an empty port space
_counter = itertools.count()
log = logging.getLogger(__name__)


class EmulationFallbackWarning(RuntimeWarning):
    """The cluster runs on plain loopback: hosts are NOT emulated."""


class EmulatedHosts:
    """H emulated hosts (network namespaces) joined by shaped veth links.

    Use it as a context manager, or call :meth:`up` and :meth:`down` (``down`` is
    idempotent and also registered with :mod:`atexit`)::

        with EmulatedHosts(EmulationConfig(num_hosts=2, ranks_per_host=2)) as cluster:
            print(cluster.describe())
            rc = cluster.run(["train.py", "--epochs", "1"])

    Args:
        config: Shape and links of the cluster.
        force_loopback: Skip namespaces and run on plain loopback (also forced by
            the environment variable ``EMBARK_CLUSTER_FORCE_LOOPBACK=1``).
        require_netns: Raise :class:`EmulationError` instead of falling back, for
            measurements that are meaningless without emulated links.
        python: Interpreter that runs torchrun; defaults to this one.
        kept: The cluster outlives this process on purpose (``embark-cluster up``):
            its namespaces are named ``<prefix>up<pid>-...`` so that later launches,
            which remove the namespaces of launchers that died, leave it alone.

    Every launch in namespace mode first removes the namespaces of earlier clusters
    whose process no longer runs (a launcher killed by SIGKILL cannot clean up), and
    logs what it removed.
    """

    def __init__(
        self,
        config: EmulationConfig,
        *,
        force_loopback: bool = False,
        require_netns: bool = False,
        python: str | None = None,
        kept: bool = False,
    ) -> None:
        if not isinstance(config, EmulationConfig):
            raise ConfigError(
                f"EmulatedHosts needs a EmulationConfig, got {type(config).__name__}"
            )
        self.config = config
        self.python = python or sys.executable
        self.require_netns = require_netns
        self.fallback_reason: str | None = None
        if force_loopback or os.environ.get(FORCE_LOOPBACK_ENV, "") not in ("", "0"):
            self.fallback_reason = (
                "loopback forced (force_loopback or EMBARK_CLUSTER_FORCE_LOOPBACK)"
            )
        else:
            self.fallback_reason = netns.netns_unavailable_reason()
        if self.fallback_reason is not None and require_netns:
            raise EmulationError(f"an emulated cluster is required but {self.fallback_reason}")
        tag = netns.KEPT_TAG if kept else ""
        self.name = f"{config.name_prefix}{tag}{os.getpid()}-{next(_counter)}"
        network = config.network
        self.hosts = [
            netns.HostNet(
                namespace=f"{self.name}-h{h}",
                ifname=f"emb-h{h}",
                switch_ifname=f"sw-h{h}",
                address=config.host_address(h),
                prefixlen=network.prefixlen,
            )
            for h in range(config.num_hosts)
        ]
        self.switch = f"{self.name}-sw"
        self.owned = True  # False for a handle from state.attach_hosts: down() keeps it
        self._created: list[str] = []
        self._up = False
        #: Whether the inter-host links carry the configured shaping (see set_shaped).
        self.shaped = True

    # ------------------------------------------------------------------ state
    @property
    def mode(self) -> str:
        """``"netns"`` (emulated hosts) or ``"loopback"`` (fallback, not emulated)."""
        return "loopback" if self.fallback_reason is not None else "netns"

    @property
    def is_up(self) -> bool:
        """Whether :meth:`up` ran and :meth:`down` did not."""
        return self._up

    def describe(self) -> str:
        """One line that labels every output produced on this cluster."""
        c = self.config
        shape = f"{c.num_hosts} hosts x {c.ranks_per_host} ranks"
        if self.mode == "loopback":
            return (
                f"LOOPBACK FALLBACK (not emulated: no bandwidth difference between hosts): "
                f"{shape} on 127.0.0.1; reason: {self.fallback_reason}"
            )
        link = (
            f"{c.rate_mbit:g} Mbit/s shaped veth"
            if c.rate_mbit is not None and self.shaped
            else "unshaped veth"
        )
        delay = f", +{c.delay_ms:g} ms one-way" if c.delay_ms > 0 else ""
        if c.jitter_ms > 0:
            delay += f" +- {c.jitter_ms:g} ms"
        loss = f", {c.loss_percent:g}% packet loss" if c.loss_percent > 0 else ""
        return f"emulated: {shape}, inter-host {link}{delay}{loss}, intra-host loopback"

    # ---------------------------------------------------------------- up/down
    def up(self) -> EmulatedHosts:
        """Create namespaces, veths, bridge, addresses and shaping.

        Falls back to loopback, with a :class:`EmulationFallbackWarning` saying why,
        when namespaces cannot be created (unless ``require_netns``). Shaping that
        cannot be applied raises. Anything half-created is removed first.

        Raises:
            EmulationError: ``tc`` rejected the shaping (e.g. ``delay_ms`` on a kernel
                without netem), or creation failed and ``require_netns`` is set.
        """
        if self._up:
            raise EmulationError(f"cluster {self.name} is already up; call down() first")
        self._up = True
        atexit.register(self.down)
        if self.mode == "netns":
            try:
                with sigterm_raises():
                    self._remove_stale()
                    try:
                        self._create()
                    except EmulationError as exc:
                        if self.require_netns:
                            raise
                        self._remove()
                        self.fallback_reason = f"creating namespaces failed: {exc}"
                    else:
                        self._shape()
            except BaseException:
                # Shaping that cannot be applied is an error, not a reason to fall
                # back: a job labelled "emulated" must run on the links it asked for.
                self._up = False
                atexit.unregister(self.down)
                self._remove()
                raise
        if self.mode == "loopback":
            warnings.warn(
                f"embark cluster: {self.fallback_reason}; the job runs on plain loopback and is "
                f"NOT emulated (no bandwidth difference between hosts)",
                EmulationFallbackWarning,
                stacklevel=2,
            )
        return self

    def _remove_stale(self) -> None:
        """Remove the namespaces of clusters whose launcher died, saying what and why."""
        prefix = self.config.name_prefix
        try:
            removed = netns.cleanup_stale(prefix)
        except EmulationError as exc:
            log.warning(
                "could not remove the namespaces a killed embark cluster left behind: %s; "
                "they do not block this cluster",
                exc,
            )
            return
        if removed:
            log.warning(
                "removed %d network namespaces of embark clusters whose process no longer runs "
                "(killed before it could clean up): %s",
                len(removed),
                " ".join(removed),
            )

    def _create(self) -> None:
        self._created.append(self.switch)
        netns.create_switch(self.switch)
        for host in self.hosts:
            self._created.append(host.namespace)
            netns.create_host(self.switch, host)

    def _shape(self) -> None:
        c = self.config
        for host in self.hosts:
            # Host egress carries the one-way delay (and the loss); the switch side only
            # the rate, so host-to-host latency is delay_ms and each direction is
            # rate-limited.
            netns.shape(
                host.namespace,
                host.ifname,
                rate_mbit=c.rate_mbit,
                delay_ms=c.delay_ms,
                jitter_ms=c.jitter_ms,
                loss_percent=c.loss_percent,
            )
            netns.shape(self.switch, host.switch_ifname, rate_mbit=c.rate_mbit)

    def set_shaped(self, shaped: bool) -> None:
        """Shape the inter-host links as configured (True), or take the shaping off (False:
        the veths' own rate, no delay), on a cluster that is up; loopback has nothing to
        shape. The same hosts, processes and addresses either way, so a job run both ways
        differs only in what the link costs."""
        if self.mode != "netns" or shaped == self.shaped:
            return
        if shaped:
            self._shape()
        else:
            for host in self.hosts:
                netns.unshape(host.namespace, host.ifname)
                netns.unshape(self.switch, host.switch_ifname)
        self.shaped = shaped

    def _remove(self) -> None:
        with signals_deferred():
            errors = []
            for ns in reversed(self._created):
                try:
                    netns.delete_namespace(ns)
                except EmulationError as exc:
                    errors.append(str(exc))
            self._created.clear()
        if errors:
            raise EmulationError("; ".join(errors))

    def down(self) -> None:
        """Remove everything :meth:`up` created; safe to call any number of times."""
        if not self.owned:
            self._up = False
            return
        atexit.unregister(self.down)
        self._up = False
        self._remove()

    def __enter__(self) -> EmulatedHosts:
        self._sigterm = sigterm_raises()
        self._sigterm.__enter__()
        try:
            return self.up()
        except BaseException:
            self._sigterm.__exit__(*sys.exc_info())
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self.down()
        finally:
            self._sigterm.__exit__(exc_type, exc, tb)

    # -------------------------------------------------------------------- run
    def job_env(self, host: int, env: dict | None = None) -> dict[str, str]:
        """The environment of ``host``'s torchrun (see :func:`launch.rank_env`)."""
        c = self.config
        full = rank_env(
            extra=env,
            ifname=self.hosts[host].ifname if self.mode == "netns" else "lo",
            mode=self.mode,
            num_hosts=c.num_hosts,
            ranks_per_host=c.ranks_per_host,
            rate_mbit=c.rate_mbit if self.mode == "netns" and self.shaped else None,
            describe=self.describe(),
        )
        full.pop(FORCE_LOOPBACK_ENV, None)
        return full

    def launches(
        self, argv: list[str], *, env: dict | None = None, master_port: int | None = None
    ) -> list[HostLaunch]:
        """The processes :meth:`run` starts: one torchrun per host, or one in loopback."""
        c = self.config
        if self.mode == "loopback":
            cmd = torchrun_argv(
                python=self.python,
                nnodes=1,
                node_rank=0,
                nproc_per_node=c.world_size,
                master_addr="127.0.0.1",
                master_port=master_port or free_loopback_port(),
                argv=argv,
            )
            return [HostLaunch(label="[loopback]", argv=cmd, env=self.job_env(0, env))]
        port = master_port or NETNS_MASTER_PORT
        return [
            HostLaunch(
                label=f"[host {h}]",
                argv=[
                    "ip",
                    "netns",
                    "exec",
                    host.namespace,
                    *torchrun_argv(
                        python=self.python,
                        nnodes=c.num_hosts,
                        node_rank=h,
                        nproc_per_node=c.ranks_per_host,
                        master_addr=self.hosts[0].address,
                        master_port=port,
                        argv=argv,
                    ),
                ],
                env=self.job_env(h, env),
                namespace=host.namespace,
            )
            for h, host in enumerate(self.hosts)
        ]

    def run(
        self,
        argv: list[str],
        *,
        env: dict | None = None,
        master_port: int | None = None,
        log_prefix: bool = True,
    ) -> int:
        """Run ``torchrun ... argv`` on every host and wait for the job.

        Args:
            argv: Script and its arguments, as after ``torchrun [options]``
                (``["train.py", "--lr", "0.1"]`` or ``["-m", "pkg.mod"]``).
            env: Extra environment variables for every rank.
            master_port: Rendezvous port on host 0; by default 29500 in netns mode
                (each host namespace has its own ports), a free port on loopback.
            log_prefix: Prefix each output line with ``[host h]``; otherwise the
                ranks write straight to our stdout/stderr.

        Returns:
            0 on success, else the first failing host's exit status (the other
            hosts are killed when one fails).
        """
        if not self._up:
            raise EmulationError(
                "the cluster is not up; use `with EmulatedHosts(...)` or call up() first"
            )
        if not argv:
            raise ConfigError("run() needs a script to launch, e.g. ['train.py']")
        with sigterm_raises():
            launches = self.launches(list(argv), env=env, master_port=master_port)
            return run_job(launches, log_prefix=log_prefix)
