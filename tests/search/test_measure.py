"""``measure_plan``: a plan with compressing towers trains the model over those towers."""

from __future__ import annotations

import pytest

from lightning_embark.testing._ranks import run_gloo_ranks


def _measure_dot_towers(rank: int, world: int) -> None:
    import os

    from lightning_embark.plan import Plan, TowerModule
    from lightning_embark.planner import (
        CostModel,
        load_calibration,
        partition_tables,
        plan_with_towers,
    )
    from lightning_embark.search._measure import Workload, measure_plan
    from lightning_embark.spec import load_spec

    model = CostModel(
        load_spec("demo-small", max_rows=2000),
        load_calibration("emulated"),
        num_hosts=2,
        ranks_per_host=1,
        batch_size=32,
    )
    towers = partition_tables(model, 2, module=TowerModule.DOT, output_ratio=4.0)
    plan = plan_with_towers(model, towers).plan
    assert {t.module for t in Plan.from_dict(plan.to_dict()).towers} == {TowerModule.DOT}
    workload = Workload(
        model="demo-small",
        max_rows=2000,
        batch_size=32,
        steps=2,
        warmup=1,
        seed=0,
        interaction="dot",
        dense_arch="16",
        over_arch="16,1",
        dense_compression="fp32",
    )
    # A flat model under a plan with dot towers would be refused (its model reads
    # per-feature vectors); the run trains the DLRM over the plan's towers instead.
    # Two hosts of one rank, as torchrun would launch them.
    os.environ.update(LOCAL_RANK="0", NODE_RANK=str(rank), GROUP_RANK=str(rank))
    measured = measure_plan(plan.to_dict(), workload)
    assert len(measured.step_seconds) == 2 and not measured.stopped


@pytest.mark.multiprocess
def test_a_plan_with_dot_towers_is_measured_on_the_towered_model() -> None:
    run_gloo_ranks(_measure_dot_towers, 2)
