"""The headline strategies estimated at scale by the calibrated cost model (not measured).

The emulated cluster has 2 hosts; EMBark's claims are about 8 and 16 hosts of
``dgx-h100``. This prices every strategy's plan there with one :class:`CostModel`, the
embedding part only, as ``benchmarks/planner_quality.py`` does: torchrec's planner (limited
to table-row-wise, or its default search), that plan with fp16 wires, and the greedy plan,
lossless or allowed ``--allow``'s compressions.

torchrec's planner is given enough time to finish its search (``--torchrec-timeout``,
600 s by default): a search cut short returns the best plan found by then, and a claim
against a cut search is a claim against a weak baseline. Each torchrec row's note says
whether its search finished (and in how long) or was cut.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Sequence
from typing import Any

from .progress import log


def _with_compression(plan: Any, compression: str) -> Any:
    """``plan`` with every exchanged (non-DP) cluster's forward and backward wire at
    ``compression``: torchrec's plan under ``qcomms`` (both directions, as
    ``qcomms_config`` sets them)."""
    from lightning_embark.plan import ClusterType

    clusters = tuple(
        c
        if c.type is ClusterType.DP
        else dataclasses.replace(
            c, forward_compression=compression, backward_compression=compression
        )
        for c in plan.clusters
    )
    return dataclasses.replace(plan, clusters=clusters)


def _torchrec_plan(
    spec: Any,
    *,
    hosts: int,
    ranks_per_host: int,
    batch_size: int,
    topology: Any,
    timeout: int | None,
    sharding_types: Sequence[str] | None,
) -> tuple[Any, dict[str, Any]]:
    """torchrec's planner's plan as ours, and its search: ``finished`` (else cut at
    ``timeout``), ``search_s`` and the ``note`` the table prints (:func:`search_note`).

    With ``sharding_types`` every table is limited to them (``torchrec-twrw``: the
    constraints ``TorchrecStrategy`` gives torchrec's planner); without, it is
    ``planner_quality.py``'s plan.
    """
    from lightning_embark.baseline import plan_from_torchrec, torchrec_plan

    limit = (
        "default search" if sharding_types is None else "limited to " + ",".join(sharding_types)
    )
    log(f"  torchrec's planner ({limit}), up to {timeout or 'unlimited'} s")
    planning = torchrec_plan(
        spec,
        num_hosts=hosts,
        ranks_per_host=ranks_per_host,
        batch_size=batch_size,
        topology=topology,
        timeout_seconds=timeout,
        sharding_types=sharding_types,
    )
    plan = plan_from_torchrec(
        planning.plan, spec, world_size=hosts * ranks_per_host, ranks_per_host=ranks_per_host
    )
    search = {
        "finished": not planning.timed_out,
        "search_s": planning.search_seconds,
        "note": search_note(planning.timed_out, planning.search_seconds, timeout),
    }
    return plan, search


def search_note(cut: bool, seconds: float, timeout: int | None) -> str:
    """What a torchrec row's note says about its planner's search."""
    if cut:
        return f"torchrec's search cut at {timeout} s (its best plan by then)"
    return f"torchrec's search finished in {seconds:.1f} s"


def estimate_rows(
    models: Sequence[str],
    hosts_list: Sequence[int],
    *,
    labels: Sequence[str],
    ranks_per_host: int,
    batch_size: int,
    topology_name: str,
    allow: Sequence[str],
    timeout: int | None,
) -> list[dict[str, Any]]:
    """Every strategy's estimated step per model and cluster under one :class:`CostModel`.

    ``torchrec-twrw``: torchrec's planner limited to table-row-wise; ``torchrec``: its
    default planner (its search bounded by ``timeout`` s); ``torchrec-fp16``:
    that plan with fp16 wires; ``embark``: the greedy plan, lossless; ``embark-compressed``:
    the greedy plan allowed ``allow``. The original presets (mixed widths kept). The cost
    model prices the embedding part only (lookups, codecs, exchanges, DP all-reduce).
    """
    from lightning_embark.plan import Compression
    from lightning_embark.planner import CostModel, GreedyConfig, GreedyPlanner, load_calibration
    from lightning_embark.spec import load_spec

    logging.getLogger("torchrec").setLevel(logging.ERROR)
    logging.getLogger().setLevel(logging.ERROR)  # torchrec warns on the root logger per DP table
    calib = load_calibration(topology_name)
    rows = []
    for name in models:
        spec = load_spec(name)
        for hosts in hosts_list:
            log(f"estimate {name} on {hosts} x {ranks_per_host} {topology_name}")
            model = CostModel(
                spec, calib, num_hosts=hosts, ranks_per_host=ranks_per_host, batch_size=batch_size
            )
            topology = calib.topology(num_hosts=hosts, ranks_per_host=ranks_per_host)
            est: dict[str, dict[str, Any]] = {}
            plan_torchrec = functools.partial(
                _torchrec_plan,
                spec,
                hosts=hosts,
                ranks_per_host=ranks_per_host,
                batch_size=batch_size,
                topology=topology,
                timeout=timeout,
            )
            if "torchrec-twrw" in labels:
                plan, search = plan_torchrec(sharding_types=("table_row_wise",))
                est["torchrec-twrw"] = {
                    "step_ms": model.estimate(plan).step_time_ms,
                    "note": search["note"],
                    "search": search,
                }
            if {"torchrec", "torchrec-fp16"} & set(labels):
                torchrec_plan, search = plan_torchrec(sharding_types=None)
                note = search["note"]
                if "torchrec" in labels:
                    est["torchrec"] = {
                        "step_ms": model.estimate(torchrec_plan).step_time_ms,
                        "note": note,
                        "search": search,
                    }
                if "torchrec-fp16" in labels:
                    fp16 = _with_compression(torchrec_plan, "fp16")
                    est["torchrec-fp16"] = {
                        "step_ms": model.estimate(fp16).step_time_ms,
                        "note": f"{note}; torchrec's plan, fp16 wires",
                        "search": search,
                    }
            if "embark" in labels:
                ours = GreedyPlanner().plan(model)
                est["embark"] = {"step_ms": ours.estimate.step_time_ms, "note": "lossless"}
            if "embark-compressed" in labels:
                allowed = tuple(Compression(c) for c in ("fp32", *allow))
                ours = GreedyPlanner(GreedyConfig(allow=allowed)).plan(model)
                est["embark-compressed"] = {
                    "step_ms": ours.estimate.step_time_ms,
                    "note": "allow " + ",".join(allow),
                }
            rows.append(
                {
                    "model": name,
                    "hosts": hosts,
                    "ranks_per_host": ranks_per_host,
                    "batch_size": batch_size,
                    "strategies": est,
                }
            )
    return rows
