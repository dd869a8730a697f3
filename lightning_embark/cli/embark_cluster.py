"""``embark-cluster``: create, use and remove an emulated multi-host cluster.

    embark-cluster up --hosts 2 --ranks-per-host 2 --rate-mbit 800
    embark-cluster run --attach -- train.py --epochs 1     # on the cluster that is up
    embark-cluster down
    embark-cluster run --hosts 2 --ranks-per-host 2 -- train.py   # create, run, remove

``up`` leaves the cluster running and records it in a small JSON state file, one per
user (``--state-file``, else ``$EMBARK_CLUSTER_STATE``, else under ``$XDG_RUNTIME_DIR``
or ``~/.cache``: :func:`~lightning_embark.emulation.default_state_file`) so that later
``run --attach`` and ``down`` find it. Every launch first removes the namespaces of
clusters whose launcher was killed before it could clean up; ``up`` also removes what
is left of a recorded cluster that lost some of its namespaces.
"""

from __future__ import annotations

import argparse
import atexit
import sys
import warnings
from pathlib import Path

from lightning_embark.cli._args import rate_mbit
from lightning_embark.emulation import (
    DEFAULT_NAME_PREFIX,
    DEFAULT_RATE_MBIT,
    DEFAULT_STATE_DESCRIPTION,
    DEFAULT_SUBNET,
    EmulatedHosts,
    EmulationConfig,
    EmulationFallbackWarning,
    attach_hosts,
    cleanup_stale,
    default_state_file,
    delete_namespace,
    hosts_state,
    kept_namespaces,
    list_namespaces,
    measure_link,
    read_state,
    recorded_namespaces,
    sigterm_raises,
    state_alive,
    state_remains,
    write_state,
)
from lightning_embark.errors import ConfigError, EmulationError


def _add_cluster_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("cluster shape and links")
    add = group.add_argument
    add("--hosts", type=int, default=2, help="number of emulated hosts (default: 2)")
    add(
        "--ranks-per-host",
        type=int,
        default=2,
        help="ranks per host, torchrun --nproc-per-node (default: 2)",
    )
    add(
        "--rate-mbit",
        type=rate_mbit,
        default=DEFAULT_RATE_MBIT,
        help="inter-host link rate in Mbit/s per direction, or 'none' for an unshaped "
        f"link (default: {DEFAULT_RATE_MBIT:g})",
    )
    add("--delay-ms", type=float, default=0.0, help="one-way inter-host delay in ms (default: 0)")
    add(
        "--subnet",
        default=DEFAULT_SUBNET,
        help=f"inter-host IPv4 subnet (default: {DEFAULT_SUBNET})",
    )
    add(
        "--name-prefix",
        default=DEFAULT_NAME_PREFIX,
        help=f"namespace name prefix (default: {DEFAULT_NAME_PREFIX})",
    )
    add(
        "--force-loopback",
        action="store_true",
        help="skip namespaces; run on plain loopback (NOT emulated)",
    )
    add("--require-netns", action="store_true", help="fail instead of falling back to loopback")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for documentation and tests)."""
    parser = argparse.ArgumentParser(
        prog="embark-cluster",
        description="Emulate a multi-host cluster on one machine: network namespaces "
        "joined by tc-shaped veth links.",
    )
    parser.add_argument(
        "--state-file",
        type=Path,
        default=default_state_file(),
        help=f"where `up` records the cluster, one file per user (default: "
        f"{DEFAULT_STATE_DESCRIPTION})",
    )
    sub = parser.add_subparsers(dest="action", required=True, metavar="{up,down,run}")
    # Also accepted after the action (`embark-cluster down --state-file x`).
    state_option = argparse.ArgumentParser(add_help=False)
    state_option.add_argument(
        "--state-file", type=Path, default=argparse.SUPPRESS, help="as above"
    )

    up = sub.add_parser("up", parents=[state_option], help="create a cluster and leave it running")
    _add_cluster_options(up)
    up.add_argument(
        "--measure-seconds",
        type=float,
        default=1.0,
        help="duration of each link probe; 0 skips it (default: 1)",
    )

    down = sub.add_parser(
        "down",
        parents=[state_option],
        help="remove the cluster that is up and any stale leftovers",
    )
    down.add_argument(
        "--name-prefix", default=DEFAULT_NAME_PREFIX, help="prefix of stale namespaces to remove"
    )

    run = sub.add_parser(
        "run",
        parents=[state_option],
        help="run `torchrun ... script` on every host (creates and removes "
        "a cluster unless --attach)",
    )
    _add_cluster_options(run)
    run.add_argument(
        "--attach",
        action="store_true",
        help="use the cluster that `up` created instead of a new one",
    )
    run.add_argument(
        "--master-port",
        type=int,
        default=None,
        help="rendezvous port on host 0 (default: 29500 in a namespace, a free port on loopback)",
    )
    run.add_argument(
        "--no-log-prefix", action="store_true", help="do not prefix output lines with [host h]"
    )
    run.add_argument("command", nargs=argparse.REMAINDER, help="-- script.py [args...]")
    return parser


def _config(args: argparse.Namespace) -> EmulationConfig:
    return EmulationConfig(
        num_hosts=args.hosts,
        ranks_per_host=args.ranks_per_host,
        rate_mbit=args.rate_mbit,
        delay_ms=args.delay_ms,
        subnet=args.subnet,
        name_prefix=args.name_prefix,
    )


def _cluster(args: argparse.Namespace, *, kept: bool = False) -> EmulatedHosts:
    return EmulatedHosts(
        _config(args),
        force_loopback=args.force_loopback,
        require_netns=args.require_netns,
        kept=kept,
    )


def _where(args: argparse.Namespace) -> str:
    """`` --state-file PATH`` for the hints, unless it is the default."""
    return "" if args.state_file == default_state_file() else f" --state-file {args.state_file}"


def _check_recorded(args: argparse.Namespace) -> None:
    """Refuse a second ``up`` over a whole cluster; clear the remains of a broken one."""
    state = read_state(args.state_file)
    if state is None:
        return
    if state_alive(state):
        raise EmulationError(
            f"cluster {state['name']} is already up (state in {args.state_file}); "
            f"run `embark-cluster down{_where(args)}` first"
        )
    remains = state_remains(state)
    for ns in remains:
        delete_namespace(ns)
    if remains:
        gone = sorted(set(recorded_namespaces(state)) - set(remains))
        print(
            f"removed what was left of cluster {state['name']} recorded in {args.state_file} "
            f"(namespaces {gone} were gone): {' '.join(remains)}"
        )


def _up(args: argparse.Namespace) -> int:
    _check_recorded(args)
    cluster = _cluster(args, kept=True)
    cluster.up()
    try:
        state = hosts_state(cluster)
        print(cluster.describe())
        per_host = cluster.config.ranks_per_host
        for h, host in enumerate(cluster.hosts):
            where = "127.0.0.1"
            if cluster.mode == "netns":
                where = f"netns {host.namespace}, {host.ifname} {host.address}"
            print(f"  host {h}: {where}, ranks {h * per_host}..{(h + 1) * per_host - 1}")
        if cluster.mode == "netns":
            print(f"  switch: netns {cluster.switch} (bridge joining the hosts)")
        if args.measure_seconds > 0:
            link = measure_link(cluster, seconds=args.measure_seconds)
            state["measured"] = {
                "intra_host_mb_s": link.intra_host_mb_s,
                "inter_host_mb_s": link.inter_host_mb_s,
            }
            print(f"  measured (TCP, {args.measure_seconds:g} s): {link.summary()}")
        write_state(args.state_file, state)
    except BaseException:
        cluster.down()
        raise
    atexit.unregister(cluster.down)  # `up` leaves it running on purpose
    where = _where(args)
    print(
        f"state: {args.state_file}; next: embark-cluster run{where} --attach -- script.py ...; "
        f"embark-cluster down{where}"
    )
    return 0


def _down(args: argparse.Namespace) -> int:
    removed: list[str] = []
    if args.state_file.exists():
        state = read_state(args.state_file)
        if state:
            for ns in recorded_namespaces(state):
                if ns in list_namespaces():
                    delete_namespace(ns)
                    removed.append(ns)
        args.state_file.unlink()
    removed += cleanup_stale(args.name_prefix)
    print(
        f"removed {len(removed)} namespaces: {' '.join(removed)}"
        if removed
        else "no cluster was up"
    )
    others = kept_namespaces(args.name_prefix)
    if others:
        print(
            f"kept {len(others)} namespaces of clusters another state file records (another "
            f"user's or shell's `embark-cluster up`): {' '.join(others)}; remove one with "
            "`embark-cluster down --state-file FILE`, or by hand with `ip netns delete NAME`"
        )
    return 0


def _run(args: argparse.Namespace) -> int:
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise ConfigError(
            "embark-cluster run needs a script: embark-cluster run [options] -- script.py "
            "[args...]"
        )
    log_prefix = not args.no_log_prefix
    if args.attach:
        cluster = attach_hosts(args.state_file)
        print(f"[embark-cluster] {cluster.describe()}", flush=True)
        rc = cluster.run(command, master_port=args.master_port, log_prefix=log_prefix)
    else:
        with _cluster(args) as cluster:
            print(f"[embark-cluster] {cluster.describe()}", flush=True)
            rc = cluster.run(command, master_port=args.master_port, log_prefix=log_prefix)
    print(f"[embark-cluster] job exited with status {rc}", flush=True)
    return rc if rc >= 0 else 128 - rc


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``embark-cluster``; returns the exit status."""
    args = build_parser().parse_args(argv)
    handlers = {"up": _up, "down": _down, "run": _run}
    try:
        with warnings.catch_warnings(), sigterm_raises():
            # The describe() line printed by every action already says why and how.
            warnings.simplefilter("ignore", EmulationFallbackWarning)
            return handlers[args.action](args)
    except ConfigError as exc:
        print(f"embark-cluster: error: {exc}", file=sys.stderr)
        return 2
    except EmulationError as exc:
        print(f"embark-cluster: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("embark-cluster: interrupted; the job was stopped and cleaned up", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
