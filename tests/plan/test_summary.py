"""plan_summary: one line for the topology, the plan, each cluster and each table."""

from __future__ import annotations

from lightning_embark.plan import layouts, plan_summary
from lightning_embark.plan._types import ClusterPlan, Plan, RowSplit
from lightning_embark.topology import Topology


def _plan() -> Plan:
    return Plan(
        world_size=4,
        ranks_per_host=2,
        clusters=(
            ClusterPlan(
                name="fast",
                type="rb",
                forward_compression="fp8",
                backward_compression="bf16",
                hierarchical=True,
            ),
            ClusterPlan(name="uniq", type="ub"),
            ClusterPlan(name="dense", type="dp"),
            ClusterPlan(name="idle", type="rb"),
        ),
        tables=(
            layouts.row_wise("a", "fast", [0, 1, 2, 3], RowSplit.RANGE),
            layouts.replicated("b", "uniq", [[0, 1], [2, 3]], num_col_shards=2),
            layouts.data_parallel("c", "dense", 4),
            layouts.table_wise("d", "fast", 3),
        ),
    )


def test_summary_lines() -> None:
    assert plan_summary(_plan()).splitlines() == [
        "plan: 4 ranks, 2 per host, 4 tables",
        "cluster fast (RB, compression fwd/bwd fp8/bf16, hierarchical): 2 table(s)",
        "  a: RB r=1 k=4 range c=1 compression=fp8/bf16 ranks=0,1,2,3",
        "  d: RB r=1 k=1 c=1 compression=fp8/bf16 ranks=3",
        "cluster uniq (UB, compression fwd/bwd fp32/fp32, flat): 1 table(s)",
        "  b: UB r=2 k=1 c=2 compression=fp32/fp32 ranks=0,1; 2,3",
        "cluster dense (DP, compression fwd/bwd -, flat): 1 table(s)",
        "  c: DP r=4 k=1 c=1 compression=- ranks=all",
        "cluster idle (RB, compression fwd/bwd fp32/fp32, flat): 0 table(s)",
    ]


def test_summary_starts_with_the_topology_when_given() -> None:
    topology = Topology(
        name="lab",
        num_hosts=2,
        ranks_per_host=2,
        intra_host_bandwidth=1.0,
        inter_host_bandwidth=1.0,
    )
    lines = plan_summary(_plan(), topology).splitlines()
    assert lines[0] == "topology lab: 2 host(s) x 2 rank(s)"
    assert lines[1:] == plan_summary(_plan()).splitlines()


def test_hash_split_is_not_named_and_one_row_shard_names_no_split() -> None:
    plan = Plan(
        world_size=2,
        ranks_per_host=2,
        clusters=(ClusterPlan(name="c", type="rb"),),
        tables=(
            layouts.row_wise("h", "c", [1, 0]),
            layouts.row_wise("one", "c", [1], RowSplit.RANGE),
        ),
    )
    lines = plan_summary(plan).splitlines()
    assert lines[2] == "  h: RB r=1 k=2 hash c=1 compression=fp32/fp32 ranks=1,0"
    assert lines[3] == "  one: RB r=1 k=1 c=1 compression=fp32/fp32 ranks=1"
