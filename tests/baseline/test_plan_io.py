"""torchrec ShardingPlan export/import round trip and evaluation under our model."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_embark.baseline._plan_io import plan_from_torchrec, plan_to_torchrec, torchrec_plan
from lightning_embark.errors import ConfigError
from lightning_embark.plan._types import ClusterPlan, Plan, RowSplit, TableLayout
from lightning_embark.planner._cost import CostModel
from lightning_embark.planner._hardware import load_calibration
from lightning_embark.spec import ModelSpec, TableSpec, load_spec

SPEC = ModelSpec(
    name="io",
    tables=tuple(
        TableSpec(name=f"t{i}", num_embeddings=1000 + 37 * i, embedding_dim=32, pooling_factor=2.0)
        for i in range(6)
    ),
)
HOSTS, LOCAL = 2, 4
WORLD = HOSTS * LOCAL
#: Seconds torchrec's planner may take over ``SPEC``: it takes about 0.1 s on a 2-core
#: machine, a search gone unbounded or a planner called once per table far longer.
PLANNING_BUDGET_S = 10.0


@st.composite
def layouts(draw, name: str):
    kind = draw(st.sampled_from(["dp", "tw", "cw", "rw", "twrw", "grid"]))
    if kind == "dp":
        return TableLayout(
            table=name, cluster="dp", num_replicas=WORLD, ranks=tuple((r,) for r in range(WORLD))
        )
    if kind == "tw":
        return TableLayout(table=name, cluster="tr", ranks=((draw(st.integers(0, WORLD - 1)),),))
    if kind == "cw":
        c = draw(st.sampled_from([2, 4, 8]))
        ranks = draw(st.lists(st.integers(0, WORLD - 1), min_size=c, max_size=c))
        return TableLayout(table=name, cluster="tr", num_col_shards=c, ranks=(tuple(ranks),))
    if kind == "rw":
        return TableLayout(
            table=name,
            cluster="tr",
            num_row_shards=WORLD,
            row_split=RowSplit.RANGE,
            ranks=(tuple(range(WORLD)),),
        )
    host = draw(st.integers(0, HOSTS - 1))
    if kind == "twrw":
        k = draw(st.integers(2, LOCAL))
        return TableLayout(
            table=name,
            cluster="tr_hier",
            num_row_shards=k,
            row_split=RowSplit.RANGE,
            ranks=(tuple(range(host * LOCAL, host * LOCAL + k)),),
        )
    hosts = draw(st.lists(st.integers(0, HOSTS - 1), min_size=2, max_size=2))
    ranks = tuple(
        h * LOCAL + i for i in range(LOCAL) for h in hosts
    )  # block i*c+j: row i on host j
    return TableLayout(
        table=name,
        cluster="tr_hier",
        num_row_shards=LOCAL,
        num_col_shards=2,
        row_split=RowSplit.RANGE,
        ranks=(ranks,),
    )


@st.composite
def plans(draw):
    tables = tuple(draw(layouts(t.name)) for t in SPEC.tables)
    used = {t.cluster for t in tables}
    clusters = tuple(
        c
        for c in (
            ClusterPlan(name="dp", type="dp"),
            ClusterPlan(name="tr", type="rb"),
            ClusterPlan(name="tr_hier", type="rb", hierarchical=True),
        )
        if c.name in used
    )
    return Plan(world_size=WORLD, ranks_per_host=LOCAL, clusters=clusters, tables=tables)


@settings(max_examples=30, deadline=None)
@given(plans())
def test_export_import_round_trip(plan: Plan) -> None:
    plan.validate(SPEC)
    back = plan_from_torchrec(
        plan_to_torchrec(plan, SPEC), SPEC, world_size=WORLD, ranks_per_host=LOCAL
    )
    assert back == plan


def test_inexpressible_layouts_are_named() -> None:
    hashed = TableLayout(table="t0", cluster="tr", num_row_shards=2, ranks=((0, 1),))
    rest = tuple(TableLayout(table=t.name, cluster="tr", ranks=((0,),)) for t in SPEC.tables[1:])
    plan = Plan(
        world_size=WORLD,
        ranks_per_host=LOCAL,
        clusters=(ClusterPlan(name="tr", type="rb"),),
        tables=(hashed, *rest),
    )
    with pytest.raises(ConfigError, match=r"table 't0' cannot be exported.*hash"):
        plan_to_torchrec(plan, SPEC)


def _torchrec_planning(topology: Any, **options: Any) -> Any:
    """torchrec's planner on ``SPEC`` (2 x 2 emulated, 256 per rank, CPU devices)."""
    return torchrec_plan(
        SPEC,
        num_hosts=HOSTS,
        ranks_per_host=LOCAL,
        batch_size=256,
        topology=topology,
        compute_device="cpu",
        **options,
    )


def test_torchrec_planner_plan_imports_and_estimates() -> None:
    logging.getLogger("torchrec").setLevel(logging.ERROR)
    calib = load_calibration("emulated")
    topology = calib.topology(num_hosts=HOSTS, ranks_per_host=LOCAL)
    planning = _torchrec_planning(topology, proposer="greedy")
    assert not planning.timed_out and planning.num_proposals > 0
    plan = plan_from_torchrec(planning.plan, SPEC, world_size=WORLD, ranks_per_host=LOCAL)
    plan.validate(SPEC, topology)
    estimate = CostModel(
        SPEC, calib, num_hosts=HOSTS, ranks_per_host=LOCAL, batch_size=256
    ).estimate(plan)
    assert estimate.step_time_ms > 0 and len(estimate.per_rank) == WORLD
    # The planner's clock: positive, the search inside the whole, and far below what a
    # search gone unbounded would take (this one takes about 0.1 s on a 2-core machine).
    assert 0 < planning.search_seconds <= planning.seconds < PLANNING_BUDGET_S


def test_torchrec_planner_timeout_returns_best_plan_so_far() -> None:
    """A search longer than its budget stops at it. torchrec's default proposers over the
    200 tables of T200 on 2 x 2 ranks search for about 10 s (2,000 proposals of about 5 ms
    each on a 2-core machine), so with ``timeout_seconds=1`` the search must pass 1 s (the
    planner looks at its clock between proposals) and end well before 5 s (the budget, a
    few milliseconds' proposal and the plan's output after it; half the full search), and
    the best plan found until then is valid."""
    logging.getLogger("torchrec").setLevel(logging.ERROR)
    calib = load_calibration("emulated")
    with pytest.raises(ConfigError, match="timeout_seconds must be positive, got 0"):
        _torchrec_planning(
            calib.topology(num_hosts=HOSTS, ranks_per_host=LOCAL), timeout_seconds=0
        )
    large = load_spec("hugectr-200table-100B-hotness20", max_rows=100_000)
    topology = calib.topology(num_hosts=2, ranks_per_host=2)
    planning = torchrec_plan(
        large,
        num_hosts=2,
        ranks_per_host=2,
        batch_size=256,
        topology=topology,
        compute_device="cpu",
        timeout_seconds=1,
    )
    plan_from_torchrec(planning.plan, large, world_size=4, ranks_per_host=2).validate(
        large, topology
    )
    assert planning.timed_out and planning.num_proposals >= 1
    assert 1.0 < planning.search_seconds < 5.0 and planning.search_seconds <= planning.seconds


def test_torchrec_planner_limited_to_table_row_wise() -> None:
    """``sharding_types`` limits every table, as ``TorchrecStrategy(sharding_types=...)``
    limits its planner: torchrec-twrw's plan, for estimates."""
    from lightning_embark.baseline import plan_table_layout

    logging.getLogger("torchrec").setLevel(logging.ERROR)
    topology = load_calibration("emulated").topology(num_hosts=HOSTS, ranks_per_host=LOCAL)
    planning = _torchrec_planning(topology, proposer="greedy", sharding_types=["table_row_wise"])
    layout = plan_table_layout(planning.plan)
    assert len(layout) == len(SPEC.tables)
    assert {kind for kind, _ in layout.values()} == {"table_row_wise"}
