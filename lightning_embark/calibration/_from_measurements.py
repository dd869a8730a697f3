"""Turning :func:`~lightning_embark.calibration._probes.measure_all`'s measurements into a
:class:`~lightning_embark.planner.Calibration` (``embark-calibrate``, ``--from-raw``).

The fits themselves (latency and bandwidth per link class, the lookup's terms, the
hierarchical stage's efficiency, their quality) are
:mod:`~lightning_embark.calibration._fit`'s; :func:`build_calibration` runs them over one
measurement, fills the gaps a cluster shape leaves (one host: no inter-host link; one
rank per host: no intra-host link), derives the engine's per-piece, codec and routing
overheads from its timed steps, and writes a ``source`` that says what was measured on
what.
"""

from __future__ import annotations

import statistics
from typing import Any

from lightning_embark.calibration._device import BACKEND_DEVICES
from lightning_embark.calibration._fit import (
    fit_alpha_beta,
    fit_lookup,
    hierarchical_efficiency,
    warn_poor_fits,
)
from lightning_embark.errors import ConfigError
from lightning_embark.planner import Calibration


def measured_on(measured: dict) -> str:
    """The backend a measurement ran over (``gloo`` for files from before it was recorded,
    when embark-calibrate ran on gloo only)."""
    return str(measured.get("backend") or "gloo")


def measured_device_label(measured: dict) -> str:
    """``cpu`` or ``cuda (NVIDIA H100 80GB HBM3)``: the device kind a measurement ran on,
    with the GPU's name, for the calibration's ``source``
    (:func:`~lightning_embark.calibration._device.calibration_device` reads the backend
    back, which names the kind)."""
    kind = measured.get("device") or BACKEND_DEVICES.get(measured_on(measured), "?")
    name = measured.get("device_name")
    return f"{kind} ({name})" if kind == "cuda" and name else str(kind)


def build_calibration(
    measured: dict,
    *,
    name: str = "measured",
    label: str = "",
    memory_per_rank: float | None = None,
) -> tuple[Calibration, dict[str, Any]]:
    """A :class:`Calibration` from :func:`measure_all`'s result, and the fits
    (:class:`~lightning_embark.calibration._fit.LinkFit` per link class,
    :class:`~lightning_embark.calibration._fit.LookupFit` under ``"lookup"``).

    A link class the cluster lacks (one host: no inter-host link; one rank per host: no
    intra-host link) takes the other class's figures, and ``source`` says so. Every
    fit's rms relative error is recorded in :attr:`Calibration.fit_rel_rms`, and a term
    above :data:`~lightning_embark.calibration._fit.POOR_FIT_REL_RMS` is logged as a
    warning (:func:`~lightning_embark.calibration._fit.warn_poor_fits`).
    ``source`` starts ``measured: embark-calibrate, <backend> <hosts> host(s) x <ranks> on
    <device>``, so that the calibration says what it was measured with
    (:func:`~lightning_embark.calibration._device.calibration_device` reads it back).
    """
    fits: dict[str, Any] = {}
    notes = []
    for key in ("alltoall_intra", "alltoall_inter", "allreduce"):
        series = measured.get(key)
        if not series:
            continue
        if key == "allreduce":
            world = series["world"]
            factor = 2.0 * (world - 1) / world  # ring: each rank sends and receives this share
            try:
                fits[key] = fit_alpha_beta(
                    [factor * s for s in series["sizes"]], series["seconds"]
                )
            except (
                ConfigError
            ):  # a noisy series (small sizes, loaded machine) must not sink the rest
                notes.append(
                    "all-reduce times did not grow with size: its figures come from the link fits"
                )
        else:
            fits[key] = fit_alpha_beta(series["sizes"], series["seconds_per_peer"])
    intra, inter = fits.get("alltoall_intra"), fits.get("alltoall_inter")
    if intra is None and inter is None:
        raise ConfigError("no link was measured: calibration needs at least 2 ranks")
    if intra is None:
        intra = inter
        notes.append("intra-host copied from inter-host (1 rank per host)")
    if inter is None:
        inter = intra
        notes.append("inter-host copied from intra-host (1 host)")
    assert intra is not None and inter is not None
    lookup = fit_lookup(measured["lookups"])
    pooling = fit_lookup(measured["unique_pooling"]) if measured.get("unique_pooling") else None

    def codec_bw(names: tuple[str, ...]) -> float | None:
        times = [
            (e["encode_s"] + e["decode_s"]) / 2 / e["fp32_bytes"]
            for n, e in measured["codecs"].items()
            if n in names
        ]
        return 1.0 / statistics.median(times) if times else None

    int8_bw = codec_bw(("int8",))
    cast_bw = codec_bw(("fp16", "bf16"))
    scaled_bw = codec_bw(("fp8",)) or int8_bw or cast_bw or 1e12
    piece = codec_piece = cast_piece = route = 0.0
    engine = measured.get("engine")
    if engine:
        pieces = engine["pieces"]
        piece = max(
            0.0,
            (engine["row_wise_s"] - engine["table_wise_s"])
            / (pieces["row_wise"] - pieces["table_wise"]),
        )
        cast_piece = max(
            0.0, (engine["table_wise_fp16_s"] - engine["table_wise_s"]) / pieces["table_wise"]
        )
        codec_piece = max(
            0.0, (engine["table_wise_fp8_s"] - engine["table_wise_s"]) / pieces["table_wise"]
        )
        if "row_wise_hot_s" in engine:  # measurements from before the routing term lack it
            extra = (engine["row_wise_hot_s"] - engine["table_wise_hot_s"]) - (
                engine["row_wise_s"] - engine["table_wise_s"]
            )
            route = max(0.0, extra / engine["routed_ids"])
    world, local = measured["world"], measured["ranks_per_host"]
    hier_efficiency = 1.0
    if (
        measured.get("alltoall_hierarchical")
        and fits.get("alltoall_intra")
        and fits.get("alltoall_inter")
    ):
        try:
            hier_efficiency = hierarchical_efficiency(
                measured["alltoall_hierarchical"], intra, inter
            )
        except ConfigError:
            notes.append(
                "hierarchical exchange times did not grow with size: its inter-host stage runs at "
                "the link fit"
            )
    modeled_tiny = (local - 1) * intra.latency + (world - local) * inter.latency
    overhead = max(0.0, measured.get("world_alltoall_tiny_s", 0.0) - modeled_tiny)
    links = (
        f"intra {intra.bandwidth / 1e6:.0f} MB/s + {1e6 * intra.latency:.0f} us/peer, "
        f"inter {inter.bandwidth / 1e6:.1f} MB/s + {1e6 * inter.latency:.0f} us/peer"
        + (
            f", hierarchical inter-host stage at {hier_efficiency:.2f}x"
            if hier_efficiency != 1.0
            else ""
        )
    )
    source = (
        f"measured: embark-calibrate, {measured_on(measured)} {measured['num_hosts']} "
        f"host(s) x {local} on {measured_device_label(measured)}"
        f"{', ' + label if label else ''}; {links}"
        + f"; lookup {1e9 * lookup.bag:.0f} ns/bag + {1e9 * lookup.id:.0f} ns/ID + "
        f"{1e9 * lookup.unique_row:.0f} ns/row updated + {lookup.bandwidth / 1e9:.2f} GB/s "
        f"(fwd+bwd, {measured['lookups'][0]['kernel']}); engine {1e6 * piece:.0f} us/piece, "
        f"fp16/bf16 +{1e6 * cast_piece:.0f}, fp8/int8 +{1e6 * codec_piece:.0f}, {1e9 * route:.0f} "
        "ns/ID routed to row shards"
        + (
            f"; UB requester {1e9 * pooling.bag:.0f} ns/bag + {1e9 * pooling.id:.0f} ns/ID + "
            f"{1e9 * pooling.unique_row:.0f} ns/unique row + {pooling.bandwidth / 1e9:.2f} GB/s"
            if pooling
            else ""
        )
        + ("; " + "; ".join(notes) if notes else "")
    )
    ar = fits.get("allreduce")
    fits["lookup"] = lookup
    if pooling:
        fits["unique_pooling"] = pooling
    quality = warn_poor_fits(fits)
    calib = Calibration(
        name=name,
        source=source,
        ranks_per_host=local,
        memory_per_rank=memory_per_rank,
        intra_bandwidth=intra.bandwidth,
        inter_bandwidth=inter.bandwidth,
        intra_latency=intra.latency,
        inter_latency=inter.latency,
        hierarchical_inter_efficiency=hier_efficiency,
        allreduce_bandwidth=ar.bandwidth if ar is not None and measured["num_hosts"] > 1 else None,
        allreduce_latency=ar.latency if ar is not None else None,
        lookup_bandwidth=lookup.bandwidth,
        backward_lookup_factor=0.0,  # the fit covers forward and backward together
        lookup_bag_seconds=lookup.bag,
        lookup_id_seconds=lookup.id,
        update_row_seconds=lookup.unique_row,
        route_id_seconds=route,
        unique_pool_bag_seconds=pooling.bag if pooling else 0.0,
        unique_pool_id_seconds=pooling.id if pooling else 0.0,
        unique_pool_row_seconds=pooling.unique_row if pooling else 0.0,
        unique_pool_bandwidth=pooling.bandwidth if pooling else None,
        piece_seconds=piece,
        codec_piece_seconds=codec_piece,
        cast_piece_seconds=cast_piece,
        dp_dense_bandwidth=(
            measured["dp_dense"]["bytes"] / measured["dp_dense"]["seconds"]
            if measured.get("dp_dense")
            else None
        ),
        dense_flops=(
            measured["dense_matmul"]["flops"] / measured["dense_matmul"]["seconds"]
            if measured.get("dense_matmul")
            else None
        ),
        codec_bandwidth=scaled_bw,
        cast_codec_bandwidth=cast_bw,
        int8_codec_bandwidth=int8_bw,
        kernel_overhead=overhead,
        fit_rel_rms=quality,
    )
    return calib, fits
