"""plan_figure: shared y-axes per column, table names, host boundaries, cluster-type legend."""

from __future__ import annotations

from pathlib import Path

from lightning_embark.plan import ClusterPlan, ClusterType, Plan, layouts
from lightning_embark.planner._cost import Estimate, RankEstimate
from lightning_embark.planner._plot import HOST_BOUNDARY_GID, plan_figure, plot_plans


def _estimate(world: int, scale: float) -> Estimate:
    ranks = tuple(
        RankEstimate(
            rank=r,
            host=r // 2,
            compute_ms=scale * (r + 1),
            intra_ms=1.0,
            inter_ms=2.0 * scale,
            latency_ms=0.1,
            allreduce_ms=0.5,
            total_ms=scale * (r + 1) + 3.6,
            intra_bytes=0.0,
            inter_bytes=0.0,
            memory_bytes=scale * 2**30 * (r + 1),
        )
        for r in range(world)
    )
    return Estimate(step_time_ms=max(r.total_ms for r in ranks), per_rank=ranks)


def _plan(names: list[str], *, with_ub: bool) -> Plan:
    """4 ranks on 2 hosts: the first table data-parallel, the rest table-wise RB (one UB)."""
    clusters = [ClusterPlan(name="dp", type=ClusterType.DP), ClusterPlan(name="rb", type="rb")]
    tables = [layouts.data_parallel(names[0], "dp", world_size=4)]
    tables += [layouts.table_wise(n, "rb", rank=i % 4) for i, n in enumerate(names[1:])]
    if with_ub:
        clusters.append(ClusterPlan(name="ub", type=ClusterType.UB))
        tables[-1] = layouts.row_wise(names[-1], "ub", ranks=range(4))
    return Plan(world_size=4, ranks_per_host=2, clusters=tuple(clusters), tables=tuple(tables))


def test_rows_share_y_axes_and_panels_show_names_hosts_and_cluster_types(tmp_path: Path) -> None:
    names = ["user", "item", "genre", "city"]
    embark = _plan(names, with_ub=True)
    torchrec = _plan(names[::-1], with_ub=False)  # other order: rows still mean one table
    fig = plan_figure(
        [("embark", embark, _estimate(4, 1.0)), ("torchrec", torchrec, _estimate(4, 3.0))]
    )
    axes = fig.axes
    top, bottom = axes[:3], axes[3:6]
    for a, b in zip(top, bottom, strict=True):
        assert a.get_ylim() == b.get_ylim()
    # torchrec's costs are 3x embark's: the shared axis fits the larger one.
    assert top[0].get_ylim()[1] >= 3.0 * 4 + 3.6
    for placement in (top[2], bottom[2]):
        assert [t.get_text() for t in placement.get_yticklabels()] == names
    for ax in axes[:6]:
        boundaries = [line for line in ax.get_lines() if line.get_gid() == HOST_BOUNDARY_GID]
        assert [tuple(line.get_xdata()) for line in boundaries] == [(1.5, 1.5)]
    legend = top[2].get_legend()
    assert legend.get_title().get_text() == "cluster type"
    assert [t.get_text() for t in legend.get_texts()] == ["DP", "RB", "UB"]
    assert [t.get_text() for t in bottom[2].get_legend().get_texts()] == ["DP", "RB"]
    # The placement image colours each block by its cluster: user is DP on every rank,
    # city is embark's UB (row-wise on every rank), item sits on rank 0 only.
    image = top[2].get_images()[0].get_array()
    assert image.shape == (4, 4, 3)
    assert (image[0] != 1).any(axis=-1).all() and (image[3] != 1).any(axis=-1).all()
    assert [(image[1, r] != 1).any() for r in range(4)] == [True, False, False, False]
    assert (image[0, 0] != image[3, 0]).any()  # DP and UB differ in colour
    plot_plans([("embark", embark, _estimate(4, 1.0))], str(tmp_path / "plan.png"))
    assert (tmp_path / "plan.png").stat().st_size > 0


def test_many_tables_get_a_limited_number_of_labels() -> None:
    names = [f"t{i}" for i in range(100)]
    fig = plan_figure([("embark", _plan(names, with_ub=False), _estimate(4, 1.0))], max_labels=25)
    placement = fig.axes[2]
    labels = [t.get_text() for t in placement.get_yticklabels()]
    ticks = list(placement.get_yticks())
    # ceil(100 / 25) = 4: every 4th table, each label at its own row.
    assert len(labels) == 25 and labels == [names[int(t)] for t in ticks] == names[::4]
