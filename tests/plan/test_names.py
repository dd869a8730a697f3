"""How plans name a model's tables: plan_name, its aliases, and resolve's error."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from lightning_embark.errors import ConfigError
from lightning_embark.plan import names
from lightning_embark.spec import ModelSpec, TableSpec


@dataclass
class Config:
    """The two fields naming reads of a torchrec ``EmbeddingBagConfig``."""

    name: str
    feature_names: list[str] = field(default_factory=list)


@pytest.mark.parametrize(
    ("config", "plan_name", "aliases"),
    [
        # A spec-built table: the plan calls it by its feature.
        (Config("t_f0", ["f0"]), "f0", ["f0", "t_f0"]),
        # No t_ prefix, reads itself: one name only.
        (Config("emb", ["emb"]), "emb", ["emb"]),
        # The stripped name is not its one feature: keep the torchrec name.
        (Config("t_user", ["user_id"]), "t_user", ["t_user", "user", "user_id"]),
        # Shared by two features: keep the torchrec name; the first feature is an alias.
        (Config("t_pair", ["pair_a", "pair_b"]), "t_pair", ["t_pair", "pair", "pair_a"]),
        (Config("user", ["user_id"]), "user", ["user", "user_id"]),
        # Only one t_ is stripped.
        (Config("t_t_x", ["t_x"]), "t_x", ["t_x", "t_t_x"]),
        # No feature: names only.
        (Config("t_x", []), "t_x", ["t_x", "x"]),
    ],
)
def test_plan_name_comes_first_and_aliases_do_not_repeat(
    config: Config, plan_name: str, aliases: list[str]
) -> None:
    assert names.plan_name(config) == plan_name
    got = names.aliases(config)
    assert got == aliases
    assert got[0] == names.plan_name(config)
    assert len(set(got)) == len(got)


def test_spec_configs_are_named_by_their_spec_table() -> None:
    spec = ModelSpec(
        name="s",
        tables=(
            TableSpec(name="a", num_embeddings=3, embedding_dim=4, pooling_factor=1.0),
            TableSpec(name="b", num_embeddings=5, embedding_dim=4, pooling_factor=2.0),
        ),
    )
    assert [names.plan_name(c) for c in spec.embedding_bag_configs()] == ["a", "b"]


def test_resolve_accepts_every_alias() -> None:
    config = Config("t_pair", ["pair_a", "pair_b"])
    for alias in names.aliases(config):
        assert names.resolve(config, ["other", alias]) == alias


def test_resolve_prefers_the_earlier_alias_when_several_are_planned() -> None:
    config = Config("t_f0", ["f0"])
    assert names.resolve(config, ["t_f0", "f0"]) == "f0"
    user = Config("t_user", ["user_id"])
    assert names.resolve(user, ["user_id", "user"]) == "user"


def test_resolve_names_the_table_its_aliases_and_the_planned_tables() -> None:
    config = Config("t_pair", ["pair_a", "pair_b"])
    with pytest.raises(ConfigError) as caught:
        names.resolve(config, ["zeta", "pair_b", "alpha"])
    message = str(caught.value)
    assert "table 't_pair' (features ['pair_a', 'pair_b']) is missing from the plan" in message
    assert "layout named 't_pair' or 'pair' or 'pair_a'" in message
    # sorted, and the second feature is no alias
    assert "(planned tables: ['alpha', 'pair_b', 'zeta'])" in message


def test_resolve_with_the_model_names_the_plans_unmatched_tables_once_each() -> None:
    renamed = Config("t_x", ["x"])
    model = [renamed, Config("t_y", ["y"])]
    with pytest.raises(ConfigError) as caught:
        names.resolve(renamed, ["y", "x_old", "zz", "x_old"], model=model)
    message = str(caught.value)
    assert "table 't_x' (features ['x']) is missing from the plan" in message
    assert "add a layout named 'x' or 't_x';" in message
    candidates = message.split("add a layout named ")[1].split(";")[0]
    assert candidates == "'x' or 't_x'"  # the feature and the stripped name are one candidate
    assert "the plan's tables that match no table of the model: ['x_old', 'zz']" in message
    assert "'y'" not in message  # it matched t_y


def test_resolve_with_the_model_when_every_planned_table_is_another_one() -> None:
    model = [Config("t_x", ["x"]), Config("t_y", ["y"])]
    with pytest.raises(ConfigError, match=r"every planned table is another table of the model"):
        names.resolve(model[0], ["y"], model=model)


def test_resolve_all_names_every_missing_table_in_one_error() -> None:
    model = [Config("t_a", ["a"]), Config("t_b", ["b"]), Config("t_c", ["c"])]
    assert names.resolve_all(model, ["t_a", "b", "c"]) == ["t_a", "b", "c"]
    with pytest.raises(ConfigError) as caught:
        names.resolve_all(model, ["a", "bee", "sea"])
    message = str(caught.value)
    assert "table 't_b' (features ['b']) is missing" in message
    assert "table 't_c' (features ['c']) is missing" in message
    assert "match no table of the model: ['bee', 'sea']" in message
    assert names.unmatched(["a", "t_a", "bee"], model) == ["bee"]
