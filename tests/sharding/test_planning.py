"""validate_plan: a plan whose table was renamed is refused naming both sides."""

from __future__ import annotations

import pytest
from torchrec.modules.embedding_configs import EmbeddingBagConfig

from lightning_embark.errors import ConfigError
from lightning_embark.plan import ClusterPlan, ClusterType, Plan, layouts
from lightning_embark.sharding import validate_plan


def _configs() -> list[EmbeddingBagConfig]:
    return [
        EmbeddingBagConfig(name=f"t_{f}", num_embeddings=100, embedding_dim=8, feature_names=[f])
        for f in ("x", "y")
    ]


def _plan(tables: list[str]) -> Plan:
    return Plan(
        world_size=1,
        ranks_per_host=1,
        clusters=(ClusterPlan(name="rb", type=ClusterType.RB),),
        tables=tuple(layouts.table_wise(t, "rb", 0) for t in tables),
    )


def test_a_renamed_table_names_the_plans_unknown_table() -> None:
    with pytest.raises(ConfigError) as caught:
        validate_plan(_plan(["x_renamed", "y"]), _configs(), world_size=1)
    message = str(caught.value)
    assert "table 't_x' (features ['x']) is missing from the plan" in message
    assert "add a layout named 'x' or 't_x'" in message
    assert "match no table of the model: ['x_renamed']" in message
    validate_plan(_plan(["x", "t_y"]), _configs(), world_size=1)
