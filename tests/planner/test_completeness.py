"""The greedy planner is complete for the plans it can check alone: whenever one of a family
of simple plans fits, it returns a fitting plan.

The family is built here, independently of the planner's layout space: every table either
data parallel or row-wise over all ``W`` ranks (range split, one cluster ``rb_rows``, flat
or hierarchical), priced with :meth:`CostModel.estimate` (the same memory the planner is
held to). Specs are drawn near that family's best memory, so about half the examples fit
and half do not.
"""

from __future__ import annotations

import itertools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lightning_embark.errors import PlanInfeasibleError
from lightning_embark.plan import ClusterPlan, ClusterType, Plan, RowSplit, layouts
from lightning_embark.planner._cost import CostModel
from lightning_embark.planner._greedy import GreedyPlanner
from lightning_embark.planner._greedy_config import GreedyConfig
from lightning_embark.planner._hardware import Calibration, load_calibration
from lightning_embark.spec import ModelSpec, TableSpec

GIB = 2**30


def simple_plans(spec: ModelSpec, num_hosts: int, ranks_per_host: int) -> list[Plan]:
    """Every plan of the family in the module docstring (``2^n`` choices of DP or row-wise,
    times the ``rb_rows`` cluster's flag)."""
    world = num_hosts * ranks_per_host
    flags = (False, True) if num_hosts > 1 else (False,)
    rows_ok = [t.num_embeddings >= world for t in spec.tables]
    out = []
    for choice in itertools.product((False, True), repeat=len(spec.tables)):  # True: DP
        if world == 1 and any(choice):
            continue  # one rank: DP is the same as one block
        if any(not dp and not ok for dp, ok in zip(choice, rows_ok, strict=True)):
            continue
        for hierarchical in flags:
            tables = tuple(
                layouts.data_parallel(t.name, "dp", world)
                if dp
                else layouts.row_wise(t.name, "rb_rows", range(world), RowSplit.RANGE)
                for t, dp in zip(spec.tables, choice, strict=True)
            )
            used = {layout.cluster for layout in tables}
            clusters = tuple(
                c
                for c in (
                    ClusterPlan(name="dp", type=ClusterType.DP),
                    ClusterPlan(name="rb_rows", type=ClusterType.RB, hierarchical=hierarchical),
                )
                if c.name in used
            )
            out.append(
                Plan(
                    world_size=world,
                    ranks_per_host=ranks_per_host,
                    clusters=clusters,
                    tables=tables,
                )
            )
    return out


def _model(spec: ModelSpec, calib: Calibration, hosts: int, local: int, batch: int) -> CostModel:
    return CostModel(spec, calib, num_hosts=hosts, ranks_per_host=local, batch_size=batch)


def _with_memory(calib: Calibration, memory: float) -> Calibration:
    return Calibration.from_dict(calib.to_dict() | {"memory_per_rank": memory})


def check_complete(spec: ModelSpec, calib: Calibration, hosts: int, local: int, batch: int):
    """Plan ``spec``; require a fitting plan whenever a plan of the family fits, and a plan
    that fits whenever one is returned. Returns whether the family fits."""
    model = _model(spec, calib, hosts, local, batch)
    limit = calib.memory_per_rank
    assert limit is not None
    family = [model.estimate(p).max_memory_bytes for p in simple_plans(spec, hosts, local)]
    fits = bool(family) and min(family) <= limit
    try:
        result = GreedyPlanner(GreedyConfig(allow=("fp32",))).plan(model)
    except PlanInfeasibleError as error:
        gave_up: PlanInfeasibleError | None = error
    else:
        gave_up = None
    if gave_up is not None:
        assert not fits, (
            f"the planner gave up ({gave_up}) but a simple plan needs "
            f"{min(family) / GIB:.3f} GiB of {limit / GIB:.3f} GiB"
        )
        return fits
    plan = result.plan
    plan.validate(
        spec,
        calib.topology(num_hosts=hosts, ranks_per_host=local),
        bytes_per_row_element=calib.bytes_per_element,
    )
    assert model.estimate(plan).max_memory_bytes <= limit
    return fits


@st.composite
def near_the_limit(draw):
    """A spec of 1-4 tables (some far wider than the rest), a cluster, and a memory limit
    within +-15% of the family's best plan."""
    hosts, local = draw(st.integers(1, 3)), draw(st.sampled_from([1, 2, 4, 8]))
    world = hosts * local
    shapes = draw(
        st.lists(
            st.tuples(
                st.integers(max(world, 16), 5_000_000),
                st.sampled_from([8, 16, 32, 64, 128]),
                st.floats(1.0, 40.0),
            ),
            min_size=1,
            max_size=4,
        )
    )
    spec = ModelSpec(
        name="near",
        tables=tuple(
            TableSpec(name=f"t{i}", num_embeddings=n, embedding_dim=d, pooling_factor=h)
            for i, (n, d, h) in enumerate(shapes)
        ),
    )
    calib = load_calibration(draw(st.sampled_from(["dgx-h100", "emulated"])))
    batch = draw(st.sampled_from([64, 512, 4096]))
    unlimited = _with_memory(calib, 1e30)
    model = _model(spec, unlimited, hosts, local, batch)
    best = min(model.estimate(p).max_memory_bytes for p in simple_plans(spec, hosts, local))
    scale = draw(st.floats(0.85, 1.15))
    return spec, _with_memory(calib, best * scale), hosts, local, batch


@settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(near_the_limit())
def test_a_plan_is_found_whenever_a_simple_one_fits(problem) -> None:
    """200 random specs within 15% of the memory a simple plan needs: the planner returns a
    fitting plan exactly when it must, and never one that does not fit. Derandomized, so
    CI runs the same 200 examples on every machine (the arithmetic is the same float64
    numpy on any CPU; no tolerance is involved)."""
    check_complete(*problem)


def test_billion_row_tables_on_three_hosts_fit_when_split_over_every_rank() -> None:
    """The shape of the reported failure: billion-row tables on 3 hosts x 8 ranks of 80 GB,
    where the greedy's least-loaded placement leaves a two-block table without room while
    splitting every table over all 24 ranks fits (about 95% of the limit)."""
    spec = ModelSpec(
        name="billions",
        tables=(
            TableSpec(
                name="t0", num_embeddings=1_500_000_000, embedding_dim=128, pooling_factor=1.0
            ),
            TableSpec(
                name="t1", num_embeddings=1_200_000_000, embedding_dim=128, pooling_factor=1.0
            ),
            TableSpec(
                name="t2", num_embeddings=900_000_000, embedding_dim=128, pooling_factor=1.0
            ),
            TableSpec(name="t3", num_embeddings=20_000_000, embedding_dim=64, pooling_factor=4.0),
        ),
    )
    calib = load_calibration("dgx-h100")
    model = _model(spec, calib, 3, 8, 4096)
    best = min(model.estimate(p).max_memory_bytes for p in simple_plans(spec, 3, 8))
    assert calib.memory_per_rank is not None and best <= calib.memory_per_rank
    assert best >= 0.8 * calib.memory_per_rank  # near the limit, as reported
    assert check_complete(spec, calib, 3, 8, 4096)
