"""Calibration: alpha-beta fitting on synthetic data, and a real measurement on 2 gloo ranks."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from lightning_embark.calibration._device import calibration_device, check_calibration_device
from lightning_embark.calibration._fit import (
    POOR_FIT_REL_RMS,
    LinkFit,
    fit_alpha_beta,
    hierarchical_efficiency,
    spearman,
)
from lightning_embark.calibration._from_measurements import build_calibration
from lightning_embark.errors import ConfigError
from lightning_embark.planner._cost import CostModel
from lightning_embark.planner._hardware import (
    Calibration,
    calibration_for_topology,
    load_calibration,
)
from lightning_embark.spec import load_spec
from lightning_embark.topology import topology_preset

SIZES = [4096, 65536, 262144, 1 << 20, 4 << 20]


@pytest.mark.parametrize(("alpha", "bandwidth"), [(50e-6, 1e9), (400e-6, 55e6), (0.0, 2e8)])
def test_fit_recovers_alpha_and_beta(alpha: float, bandwidth: float) -> None:
    t = [alpha + m / bandwidth for m in SIZES]
    fit = fit_alpha_beta(SIZES, t)
    assert fit.latency == pytest.approx(alpha, rel=1e-6, abs=1e-9)
    assert fit.bandwidth == pytest.approx(bandwidth, rel=1e-6)
    assert fit.rel_rms < 1e-9


def test_fit_is_robust_to_noise_and_clips_negative_latency() -> None:
    rng = np.random.default_rng(0)
    t = [(200e-6 + m / 1e8) * (1 + 0.05 * rng.standard_normal()) for m in SIZES for _ in range(5)]
    fit = fit_alpha_beta([m for m in SIZES for _ in range(5)], t)
    assert fit.latency == pytest.approx(200e-6, rel=0.25) and fit.bandwidth == pytest.approx(
        1e8, rel=0.1
    )
    # A line through below the origin (latency noise) gives latency 0 and the slope's bandwidth.
    through = fit_alpha_beta([1000, 2000, 4000], [0.5e-6, 1.5e-6, 3.5e-6])
    assert through.latency == 0.0 and through.bandwidth == pytest.approx(1e9)
    # A shaper's burst (small messages at line rate) does not inflate the sustained bandwidth.
    sizes = [4096, 65536, 1 << 20, 4 << 20]
    burst = fit_alpha_beta(sizes, [1e-4 + m / (5e8 if m <= 65536 else 4e7) for m in sizes])
    assert burst.bandwidth == pytest.approx(4e7, rel=0.1)


def test_fit_rejects_unfittable_input() -> None:
    with pytest.raises(ConfigError, match="two distinct sizes"):
        fit_alpha_beta([4096, 4096], [1e-3, 1e-3])
    with pytest.raises(ConfigError, match="does not grow"):
        fit_alpha_beta([4096, 1 << 20], [2e-3, 1e-3])
    with pytest.raises(ConfigError, match="positive"):
        fit_alpha_beta([4096, 1 << 20], [0.0, 1e-3])


def test_spearman() -> None:
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 2, 3, 4, 5], [1, 3, 2, 5, 4]) == pytest.approx(0.8)  # 1 - 6*4/(5*24)
    assert spearman([1, 1, 2], [1, 2, 3]) == pytest.approx(0.8660254)  # ties share their mean rank


def _lookup_point(bags: int, hotness: int, width: int, rows: int) -> dict:
    ids, size = bags * hotness, bags * hotness * width * 4
    unique = min(ids, rows)
    total = (
        2e-4 + bags * 1e-6 + ids * 5e-7 + size / 2e9 + unique * 3e-7
    )  # call, bag, ID, bytes, row updated
    return {
        "kernel": "TorchStore",
        "bags": bags,
        "ids": ids,
        "unique_rows": unique,
        "bytes_read": size,
        "dim": width,
        "rows": rows,
        "forward_s": total / 4,
        "backward_s": 3 * total / 4,
    }


def _synthetic_measurement(intra=(100e-6, 8e8), inter=(300e-6, 5e7)) -> dict:
    def series(alpha: float, bw: float) -> dict:
        return {
            "sizes": SIZES,
            "seconds_per_peer": [alpha + m / bw for m in SIZES],
            "group_size": 2,
            "groups": 2,
        }

    return {
        "backend": "gloo",
        "world": 4,
        "ranks_per_host": 2,
        "num_hosts": 2,
        "alltoall_intra": series(*intra),
        "alltoall_inter": series(*inter),
        "allreduce": {
            "sizes": SIZES,
            "seconds": [1e-3 + 1.5 * m / 4e7 for m in SIZES],
            "world": 4,
        },
        "world_alltoall_tiny_s": 2e-3,
        "engine": {
            "tables": 8,
            "world": 4,
            "table_wise_s": 0.02,
            "row_wise_s": 0.068,
            "table_wise_fp16_s": 0.024,
            "table_wise_fp8_s": 0.1,
            "pieces": {"table_wise": 16, "row_wise": 64},
            "table_wise_hot_s": 0.5,
            "row_wise_hot_s": 0.6,
            "routed_ids": 65536,
            "hot": 512,
        },
        "dp_dense": {"bytes": 1e7, "seconds": 0.01},
        "dense_matmul": {"flops": 6e9, "seconds": 0.1},
        "lookups": [
            _lookup_point(b, h, w, n)
            for n in (100_000, 2_000)
            for b in (512, 2048)
            for h in (1, 8, 64)
            for w in (16, 128)
        ],
        "codecs": {
            "fp16": {"encode_s": 1e-3, "decode_s": 1e-3, "fp32_bytes": 4e6},
            "fp8": {"encode_s": 6e-3, "decode_s": 2e-3, "fp32_bytes": 4e6},
        },
    }


def test_build_calibration_from_measurements(tmp_path: Path) -> None:
    calib, fits = build_calibration(
        _synthetic_measurement(), label="test links", memory_per_rank=2e9
    )
    assert calib.intra_bandwidth == pytest.approx(8e8) and calib.intra_latency == pytest.approx(
        100e-6
    )
    assert calib.inter_bandwidth == pytest.approx(5e7) and calib.inter_latency == pytest.approx(
        300e-6
    )
    assert calib.allreduce_bandwidth == pytest.approx(
        4e7
    ) and calib.allreduce_latency == pytest.approx(1e-3)
    assert (
        calib.lookup_bandwidth == pytest.approx(2e9, rel=1e-4)
        and calib.backward_lookup_factor == 0.0
    )
    assert calib.lookup_bag_seconds == pytest.approx(1e-6, rel=1e-4)
    assert calib.lookup_id_seconds == pytest.approx(5e-7, rel=1e-4)
    assert calib.update_row_seconds == pytest.approx(3e-7, rel=1e-4)
    assert calib.codec_bandwidth == pytest.approx(
        1e9
    ) and calib.cast_codec_bandwidth == pytest.approx(4e9)
    assert calib.int8_codec_bandwidth is None  # not measured: int8 plans use the fp8 figure
    with_int8 = _synthetic_measurement()
    with_int8["codecs"]["int8"] = {"encode_s": 8e-3, "decode_s": 8e-3, "fp32_bytes": 4e6}
    calib8, _ = build_calibration(with_int8)
    assert calib8.int8_codec_bandwidth == pytest.approx(
        5e8
    ) and calib8.codec_bandwidth == pytest.approx(1e9)
    # engine pieces: (68 - 20) ms over 48 extra pieces; fp16 +4 ms and fp8 +80 ms over 16 pieces
    assert calib.piece_seconds == pytest.approx(
        1e-3
    ) and calib.cast_piece_seconds == pytest.approx(0.25e-3)
    assert calib.codec_piece_seconds == pytest.approx(
        5e-3
    ) and calib.dp_dense_bandwidth == pytest.approx(1e9)
    assert calib.dense_flops == pytest.approx(60e9)  # 6 GFLOP in 0.1 s
    # routing: the hot runs differ by 100 ms, 48 ms of it the extra pieces, over 65,536 IDs
    assert calib.route_id_seconds == pytest.approx(0.052 / 65536)
    assert "793 ns/ID routed" in calib.source
    legacy = _synthetic_measurement()
    for key in ("table_wise_hot_s", "row_wise_hot_s", "routed_ids", "hot"):
        del legacy["engine"][key]
    assert build_calibration(legacy)[0].route_id_seconds == 0.0
    # tiny world all-to-all 2 ms minus modeled per-peer latencies (1 intra + 2 inter peers)
    assert calib.kernel_overhead == pytest.approx(2e-3 - 100e-6 - 2 * 300e-6)
    assert calib.source.startswith("measured: ") and "test links" in calib.source
    assert set(fits) == {"alltoall_intra", "alltoall_inter", "allreduce", "lookup"}
    assert fits["lookup"].call == pytest.approx(2e-4, rel=1e-3)
    calib.save(tmp_path / "c.json")
    assert load_calibration(tmp_path / "c.json") == calib  # what embark-plan --topology reads
    # One host: the inter-host class is copied and the source says so.
    one_host = _synthetic_measurement()
    one_host.update(num_hosts=1, ranks_per_host=4, alltoall_inter=None)
    calib1, _ = build_calibration(one_host)
    assert (
        calib1.inter_bandwidth == calib1.intra_bandwidth
        and "copied from intra-host" in calib1.source
    )


def _hierarchical_series(intra: LinkFit, inter_bandwidth: float, extra: float = 0.0) -> dict:
    """Whole 2 x 2 exchanges: the intra stage as ``intra`` predicts it (2 calls, 2 host shares
    per peer), then 2 shares per rank across hosts at ``inter_bandwidth``."""
    return {
        "sizes": SIZES,
        "world": 4,
        "ranks_per_host": 2,
        "seconds": [
            2 * intra.latency + 2 * m / intra.bandwidth + extra + 2 * m / inter_bandwidth
            for m in SIZES
        ],
    }


def test_hierarchical_efficiency_is_the_inter_stage_rate_over_the_link_fit() -> None:
    intra, inter = (
        LinkFit(latency=100e-6, bandwidth=8e8, rel_rms=0.0),
        LinkFit(latency=3e-4, bandwidth=5e7, rel_rms=0.0),
    )
    assert hierarchical_efficiency(
        _hierarchical_series(intra, 3.5e7, extra=1e-3), intra, inter
    ) == pytest.approx(0.7)
    assert hierarchical_efficiency(
        _hierarchical_series(intra, 1e8), intra, inter
    ) == pytest.approx(2.0)
    measured = _synthetic_measurement()
    measured["alltoall_hierarchical"] = _hierarchical_series(intra, 3.5e7)
    calib, _ = build_calibration(measured)
    assert (
        calib.hierarchical_inter_efficiency == pytest.approx(0.7)
        and "stage at 0.70x" in calib.source
    )
    flat = dict(
        measured["alltoall_hierarchical"], seconds=[0.01] * len(SIZES)
    )  # noise: no size dependence
    measured["alltoall_hierarchical"] = flat
    calib, _ = build_calibration(measured)
    assert calib.hierarchical_inter_efficiency == 1.0 and "did not grow with size" in calib.source
    assert (
        build_calibration(_synthetic_measurement())[0].hierarchical_inter_efficiency == 1.0
    )  # not measured


def _unique_pooling_point(bags: int, hotness: int, width: int, rows: int) -> dict:
    point = _lookup_point(bags, hotness, width, rows)
    total = (
        1e-4
        + bags * 2e-7
        + point["ids"] * 6e-8
        + point["bytes_read"] / 1e10
        + point["unique_rows"] * 7e-8
    )
    return dict(point, kernel="unique-pool", forward_s=total / 2, backward_s=total / 2)


def test_unique_pooling_fit_prices_the_ub_requester() -> None:
    """A measured UB requester replaces the lookup-priced one, for UB tables only."""
    import dataclasses

    from lightning_embark.plan import layouts
    from lightning_embark.plan._types import ClusterPlan, ClusterType, Plan

    measured = _synthetic_measurement()
    measured["unique_pooling"] = [
        _unique_pooling_point(b, h, w, n)
        for n in (100_000, 2_000)
        for b in (512, 2048)
        for h in (1, 8, 64)
        for w in (16, 128)
    ]
    calib, fits = build_calibration(measured)
    assert calib.unique_pool_bag_seconds == pytest.approx(2e-7, rel=1e-3)
    assert calib.unique_pool_id_seconds == pytest.approx(6e-8, rel=1e-3)
    assert calib.unique_pool_row_seconds == pytest.approx(7e-8, rel=1e-3)
    assert (
        calib.unique_pool_bandwidth == pytest.approx(1e10, rel=1e-3) and "unique_pooling" in fits
    )
    assert "UB requester 200 ns/bag + 60 ns/ID" in calib.source
    legacy, _ = build_calibration(_synthetic_measurement())
    assert legacy.unique_pool_bandwidth is None and legacy.unique_pool_id_seconds == 0.0

    spec = load_spec("demo-small")
    names = spec.feature_names

    def plan(kind: ClusterType) -> Plan:
        return Plan(
            world_size=4,
            ranks_per_host=2,
            clusters=(ClusterPlan(name="c", type=kind),),
            tables=tuple(layouts.row_wise(n, "c", range(4)) for n in names),
        )

    def compute_ms(c: Calibration, kind: ClusterType) -> float:
        est = CostModel(spec, c, num_hosts=2, ranks_per_host=2, batch_size=512).estimate(
            plan(kind)
        )
        return est.per_rank[0].compute_ms

    slow = dataclasses.replace(calib, unique_pool_id_seconds=1e-6)
    assert compute_ms(slow, ClusterType.RB) == compute_ms(calib, ClusterType.RB)
    ids = sum(512 * t.pooling_factor for t in spec.tables)  # every rank requests every table
    extra = compute_ms(slow, ClusterType.UB) - compute_ms(calib, ClusterType.UB)
    assert extra == pytest.approx(1e3 * ids * (1e-6 - 6e-8), rel=0.05)


def test_slower_measured_links_make_costlier_estimates() -> None:
    spec = load_spec("demo-small")
    fast, _ = build_calibration(_synthetic_measurement(inter=(300e-6, 5e8)))
    slow, _ = build_calibration(_synthetic_measurement(inter=(300e-6, 5e6)))
    from lightning_embark.planner._rules import rule_based_plan

    plan = rule_based_plan(spec, (2, 2), dp_max_rows=0)
    times = [
        CostModel(spec, c, num_hosts=2, ranks_per_host=2, batch_size=256)
        .estimate(plan)
        .step_time_ms
        for c in (fast, slow)
    ]
    assert times[1] > 2 * times[0]


def test_calibration_for_topology_keeps_the_topology_links() -> None:
    topo = topology_preset("emulated", num_hosts=2, ranks_per_host=2)
    calib = calibration_for_topology(topo)
    assert (
        calib.inter_bandwidth == topo.inter_host_bandwidth
        and calib.memory_per_rank == topo.memory_per_rank
    )
    assert calib.lookup_bandwidth == load_calibration("emulated").lookup_bandwidth
    h100 = calibration_for_topology(topology_preset("dgx-h100", num_hosts=2))
    assert h100.lookup_bandwidth == load_calibration("dgx-h100").lookup_bandwidth


def test_measured_engine_overheads_enter_the_estimate() -> None:
    """Per-piece, codec-per-piece, per-bag/ID and DP dense-pass costs raise the plans that incur
    them."""
    import dataclasses

    from lightning_embark.plan import layouts
    from lightning_embark.plan._types import ClusterPlan, ClusterType, Compression, Plan

    spec = load_spec("demo-small")
    names = spec.feature_names

    def plan(kind: str) -> Plan:
        comp = Compression.FP8 if kind == "fp8" else Compression.FP32
        if kind == "dp":
            return Plan(
                world_size=4,
                ranks_per_host=2,
                clusters=(ClusterPlan(name="dp", type=ClusterType.DP),),
                tables=tuple(layouts.data_parallel(n, "dp", 4) for n in names),
            )
        lay = (
            [layouts.row_wise(n, "rb", range(4)) for n in names]
            if kind == "rw"
            else [layouts.table_wise(n, "rb", i % 4) for i, n in enumerate(names)]
        )
        cluster = ClusterPlan(
            name="rb", type=ClusterType.RB, forward_compression=comp, backward_compression=comp
        )
        return Plan(world_size=4, ranks_per_host=2, clusters=(cluster,), tables=tuple(lay))

    base, _ = build_calibration(_synthetic_measurement())
    bare = dataclasses.replace(
        base,
        piece_seconds=0.0,
        codec_piece_seconds=0.0,
        lookup_bag_seconds=0.0,
        lookup_id_seconds=0.0,
        dp_dense_bandwidth=None,
    )

    def ms(calib: Calibration, kind: str) -> float:
        return (
            CostModel(spec, calib, num_hosts=2, ranks_per_host=2, batch_size=256)
            .estimate(plan(kind))
            .step_time_ms
        )

    # 1 ms per piece; per rank table-wise serves 2 tables x 4 requesters and requests 8 pieces,
    # row-wise serves 8 blocks x 4 requesters and requests 8 x 4 pieces.
    assert ms(base, "rw") - ms(bare, "rw") >= 64.0 - 1e-6
    assert ms(base, "tw") - ms(bare, "tw") >= 16.0 - 1e-6
    assert ms(base, "fp8") - ms(base, "tw") == pytest.approx(
        16 * 5.0, rel=0.1
    )  # 16 pieces x 5 ms, fewer bytes
    assert (
        ms(base, "dp") - ms(bare, "dp")
        > sum(4 * t.num_embeddings * t.embedding_dim for t in spec.tables) / 1e9 * 1e3
    )


def test_hierarchical_inter_efficiency_slows_only_the_hierarchical_stage() -> None:
    import dataclasses

    from lightning_embark.plan import layouts
    from lightning_embark.plan._types import ClusterPlan, ClusterType, Plan

    spec = load_spec("demo-small")

    def plan(hierarchical: bool) -> Plan:
        cluster = ClusterPlan(name="rb", type=ClusterType.RB, hierarchical=hierarchical)
        return Plan(
            world_size=4,
            ranks_per_host=2,
            clusters=(cluster,),
            tables=tuple(
                layouts.table_wise(n, "rb", i % 4) for i, n in enumerate(spec.feature_names)
            ),
        )

    base, _ = build_calibration(_synthetic_measurement())
    slow = dataclasses.replace(base, hierarchical_inter_efficiency=0.5)

    def estimate(calib: Calibration, hierarchical: bool):
        return CostModel(spec, calib, num_hosts=2, ranks_per_host=2, batch_size=256).estimate(
            plan(hierarchical)
        )

    assert estimate(slow, False) == estimate(base, False)
    fast_ranks, slow_ranks = estimate(base, True).per_rank, estimate(slow, True).per_rank
    assert all(
        s.inter_ms == pytest.approx(2 * f.inter_ms) and s.intra_ms == pytest.approx(f.intra_ms)
        for f, s in zip(fast_ranks, slow_ranks, strict=True)
    )
    assert estimate(slow, True).step_time_ms > estimate(base, True).step_time_ms
    with pytest.raises(ConfigError, match="hierarchical_inter_efficiency"):
        dataclasses.replace(base, hierarchical_inter_efficiency=0.0)


def test_a_flat_allreduce_series_falls_back_to_the_link_fits() -> None:
    """Small all-reduces on a loaded machine can take as long as large ones: no bandwidth
    can be fitted, and the calibration still builds (the flaky case of the CLI smoke run)."""
    measured = _synthetic_measurement()
    measured["allreduce"]["seconds"] = [3.8e-3] * len(SIZES)
    calib, fits = build_calibration(measured)
    assert "allreduce" not in fits and "all-reduce times did not grow" in calib.source
    assert calib.allreduce_bandwidth is None and calib.allreduce_latency is None


def test_fit_quality_is_recorded_and_a_poor_fit_warns_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("WARNING", logger="lightning_embark.calibration._fit"):
        good, _ = build_calibration(_synthetic_measurement())
    assert not caplog.records
    assert set(good.fit_rel_rms) == {"alltoall_intra", "alltoall_inter", "allreduce", "lookup"}
    assert all(error < 1e-6 for error in good.fit_rel_rms.values())  # exact synthetic points
    # The inter-host times swing by up to 45x around a line: the latency clips to 0 and
    # the fit misses its points several times over.
    noisy = _synthetic_measurement()
    noisy["alltoall_inter"]["seconds_per_peer"] = [2e-2, 1e-3, 4e-2, 2e-3, 9e-2]
    with caplog.at_level("WARNING", logger="lightning_embark.calibration._fit"):
        calib, fits = build_calibration(noisy)
    error = fits["alltoall_inter"].rel_rms
    assert error > POOR_FIT_REL_RMS and calib.fit_rel_rms["alltoall_inter"] == error
    (record,) = caplog.records  # one warning, for the one poor term
    message = record.getMessage()
    assert "calibration term alltoall_inter fits its measurements poorly" in message
    assert f"rms relative error {100 * error:.0f}%" in message
    assert f"(threshold {100 * POOR_FIT_REL_RMS:.0f}%)" in message
    assert "latency 0.0 us" in message
    calib.save(tmp_path / "c.json")
    assert load_calibration(tmp_path / "c.json").fit_rel_rms == calib.fit_rel_rms
    with pytest.raises(ConfigError, match="fit_rel_rms must map term names"):
        Calibration(
            intra_bandwidth=1.0,
            inter_bandwidth=1.0,
            lookup_bandwidth=1.0,
            fit_rel_rms={"lookup": -1.0},
        )


def test_the_calibration_records_its_backend_and_device() -> None:
    """``source`` names the backend and device kind measured on (with the GPU's name),
    which :func:`calibration_device` reads back; files from before the device was
    recorded were gloo, so CPU."""
    gloo, _ = build_calibration(_synthetic_measurement())
    nccl, _ = build_calibration(
        dict(_synthetic_measurement(), backend="nccl", device="cuda", device_name="NVIDIA H100")
    )
    old = {k: v for k, v in _synthetic_measurement().items() if k not in ("backend", "device")}
    assert calibration_device(gloo) == "cpu" and " x 2 on cpu" in gloo.source
    assert calibration_device(nccl) == "cuda" and " on cuda (NVIDIA H100)" in nccl.source
    assert nccl.source.startswith("measured: embark-calibrate, nccl ")
    assert calibration_device(build_calibration(old)[0]) == "cpu"


def test_a_cpu_calibration_planning_a_gpu_run_warns_naming_both(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gloo, _ = build_calibration(_synthetic_measurement())
    assert check_calibration_device(gloo, "cpu") is None
    with caplog.at_level(logging.WARNING, logger="lightning_embark.calibration._device"):
        message = check_calibration_device(gloo, "cuda:3")
    assert message is not None and "cpu ranks (gloo)" in message and "on cuda (nccl)" in message
    assert message in caplog.text
