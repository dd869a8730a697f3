"""The dispatch counter's counts as the tables ``embark-bench --profile`` and the GPU check
print."""

from __future__ import annotations

from collections.abc import Mapping

from lightning_embark.accounting._dispatch import DispatchSnapshot


def format_dispatch(
    title: str,
    snapshot: DispatchSnapshot,
    *,
    collectives: Mapping[str, int] | None = None,
    sites: int = 20,
) -> str:
    """One step's counts: totals, per scope, and the would-be syncs by call site.

    Args:
        title: What was counted (a run, a rank).
        snapshot: The step's counts.
        collectives: ``torch.distributed`` calls per collective in the same step (the byte
            counter's, :class:`~lightning_embark.accounting.CommCounter`), if known.
        sites: Call sites listed at most (the most frequent first).
    """
    host = sum(n for s, n in snapshot.syncs.items() if s.host_work)
    lines = [
        f"{title}: {snapshot.total_ops} ATen ops, {snapshot.device_syncs} would sync the host "
        f"on CUDA{f' (and {host} host reads by design)' if host else ''}, "
        f"{sum(snapshot.collectives.values())} collective ops per step"
    ]
    threads = sorted(snapshot.ops_by("thread").items(), key=lambda kv: -kv[1])
    lines.append("ops by thread: " + ", ".join(f"{t} {n}" for t, n in threads))
    if snapshot.interpreted_kernel_ops:
        lines.append(
            f"({snapshot.interpreted_kernel_ops} more inside Triton's interpreter: a compiled "
            "launch dispatches none)"
        )
    if collectives:
        calls = ", ".join(f"{name} {n}" for name, n in sorted(collectives.items()) if n)
        lines.append(f"torch.distributed calls: {calls or 'none'}")
    ops, syncs = snapshot.ops_by("scope"), snapshot.syncs_by_scope()
    hosts, colls = snapshot.syncs_by_scope(host_work=True), snapshot.collectives_by_scope()
    lines += [
        "",
        "| scope | ops | syncs | host reads | collective ops |",
        "|---|---:|---:|---:|---:|",
    ]
    for name in sorted(set(ops) | set(syncs) | set(colls)):
        lines.append(
            f"| {name} | {ops.get(name, 0)} | {syncs.get(name, 0)} | {hosts.get(name, 0)} | "
            f"{colls.get(name, 0)} |"
        )
    rows = sorted(snapshot.syncs.items(), key=lambda kv: (kv[0].host_work, -kv[1], kv[0].site))
    if rows:
        lines += [
            "",
            "| n | op | why | call site | scope | thread |",
            "|---:|---|---|---|---|---|",
        ]
        for s, n in rows[:sites]:
            why = f"{s.reason}{' (host work)' if s.host_work else ''}"
            lines.append(f"| {n} | {s.op} | {why} | {s.site} | {s.scope} | {s.thread} |")
        if len(rows) > sites:
            lines.append(f"({len(rows) - sites} more call sites in the JSON)")
    return "\n".join(lines)
