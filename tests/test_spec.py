"""Model specs: loading by path or preset, validation errors, row caps, torchrec configs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from lightning_embark.errors import ConfigError
from lightning_embark.spec import load_spec, preset_names, spec_from_dict

SHARED_MODELS = Path(__file__).resolve().parents[1].parent / "shared" / "models"


def test_presets_cover_the_shared_specs() -> None:
    assert {
        "mlperf-dlrm-dcnv2",
        "hugectr-180table-70B-hotness80",
        "hugectr-200table-100B-hotness20",
        "hugectr-510table-110B-hotness5",
        "demo-small",
    } <= set(preset_names())


@pytest.mark.skipif(not SHARED_MODELS.is_dir(), reason="../shared/models is not beside the repo")
@pytest.mark.parametrize("path", sorted(SHARED_MODELS.glob("*.json")), ids=lambda p: p.stem)
def test_shared_spec_files_load_and_match_presets(path: Path) -> None:
    spec = load_spec(path)
    assert spec == load_spec(path.stem)
    raw = json.loads(path.read_text())
    assert [t.name for t in spec.tables] == [t["name"] for t in raw["tables"]]
    assert spec.id_distribution.kind == raw["id_distribution"]["kind"]


def test_mlperf_spec_facts() -> None:
    spec = load_spec("mlperf-dlrm-dcnv2")
    assert len(spec.tables) == 26 and {t.embedding_dim for t in spec.tables} == {128}
    assert spec.num_dense_features == 13
    assert max(t.num_embeddings for t in spec.tables) == 40_000_000
    assert not spec.rows_capped


def test_row_cap_is_reported_and_keeps_hotness() -> None:
    spec = load_spec("mlperf-dlrm-dcnv2", max_rows=100_000)
    assert max(t.num_embeddings for t in spec.tables) == 100_000
    assert spec.rows_capped and "rows capped" in spec.describe()
    c1 = spec.tables[0]
    assert c1.original_num_embeddings == 40_000_000 and c1.pooling_factor == 3
    assert load_spec("mlperf-dlrm-dcnv2").tables[2] == spec.tables[2]  # small tables untouched
    assert spec_from_dict(spec.to_dict()) == spec


def test_embedding_bag_configs() -> None:
    configs = load_spec("demo-small").embedding_bag_configs()
    assert [c.feature_names for c in configs] == [[f"f{i}"] for i in range(8)]
    assert configs[3].num_embeddings == 50_000 and configs[3].embedding_dim == 32


def test_missing_table_field_is_named() -> None:
    with pytest.raises(ConfigError, match="table C1 is missing required field 'embedding_dim'"):
        spec_from_dict(
            {"name": "x", "tables": [{"name": "C1", "num_embeddings": 5, "pooling_factor": 1}]}
        )


def test_missing_top_level_field_is_named() -> None:
    with pytest.raises(ConfigError, match="missing required field 'tables'"):
        spec_from_dict({"name": "x"})


def test_unknown_preset_lists_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"known presets: .*mlperf-dlrm-dcnv2"):
        load_spec("no-such-model")


def test_missing_file_and_bad_json(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_spec(tmp_path / "absent.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="invalid JSON"):
        load_spec(bad)


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"num_embeddings": 0}, "num_embeddings must be a positive integer"),
        ({"embedding_dim": -1}, "embedding_dim must be a positive integer"),
        ({"pooling_factor": 0}, "pooling_factor must be > 0"),
    ],
)
def test_invalid_table_values(table: dict, message: str) -> None:
    base = {"name": "t", "num_embeddings": 10, "embedding_dim": 4, "pooling_factor": 1} | table
    with pytest.raises(ConfigError, match=message):
        spec_from_dict({"name": "x", "tables": [base]})


def test_duplicate_tables_and_bad_distribution() -> None:
    table = {"name": "t", "num_embeddings": 10, "embedding_dim": 4, "pooling_factor": 1}
    with pytest.raises(ConfigError, match="duplicate table names"):
        spec_from_dict({"name": "x", "tables": [table, table]})
    with pytest.raises(ConfigError, match="'uniform' or 'zipf'"):
        spec_from_dict({"name": "x", "tables": [table], "id_distribution": {"kind": "pareto"}})
    with pytest.raises(ConfigError, match="max_rows"):
        load_spec("demo-small", max_rows=0)


def _table(**fields: object) -> dict:
    return {"name": "C1", "num_embeddings": 10, "embedding_dim": 4, "pooling_factor": 1} | fields


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"num_embeddings": "1e9"}, r"field 'num_embeddings' must be an integer, got the string"),
        (
            {"num_embeddings": 1500000000.5},
            r"field 'num_embeddings' must be an integer, got 1500000000.5, which is not a whole",
        ),
        ({"embedding_dim": "64"}, r"field 'embedding_dim' must be an integer, got the string"),
        ({"embedding_dim": 16.5}, r"field 'embedding_dim' must be an integer, got 16.5"),
        ({"embedding_dim": True}, r"field 'embedding_dim' must be an integer, got the boolean"),
        ({"original_num_embeddings": "5"}, r"field 'original_num_embeddings' must be an integer"),
        ({"pooling_factor": "3"}, r"field 'pooling_factor' must be a number, got '3'; write it"),
        ({"pooling_factor": float("nan")}, r"field 'pooling_factor' must be a finite number"),
    ],
)
def test_spec_file_values_of_the_wrong_kind_name_file_table_and_field(
    tmp_path: Path, fields: dict, message: str
) -> None:
    path = tmp_path / "model.json"
    path.write_text(json.dumps({"name": "m", "tables": [_table(**fields)]}))
    with pytest.raises(ConfigError, match=message) as info:
        load_spec(path)
    assert str(info.value).startswith(f"{path}: table 'C1': ")


def test_whole_json_numbers_are_taken_as_integers(tmp_path: Path) -> None:
    path = tmp_path / "model.json"
    path.write_text(
        '{"name": "m", "num_dense_features": 13.0, "tables": [{"name": "C1", '
        '"num_embeddings": 1e9, "embedding_dim": 64.0, "pooling_factor": 2}]}'
    )
    spec = load_spec(path)
    (table,) = spec.tables
    assert (table.num_embeddings, table.embedding_dim) == (1_000_000_000, 64)
    assert type(table.num_embeddings) is int and type(spec.num_dense_features) is int


def test_top_level_values_and_range_errors_name_the_file(tmp_path: Path) -> None:
    path = tmp_path / "model.json"
    at = re.escape(str(path))
    path.write_text(json.dumps({"name": "m", "num_dense_features": "13", "tables": [_table()]}))
    with pytest.raises(ConfigError, match=rf"^{at}: field 'num_dense_features' must be an int"):
        load_spec(path)
    path.write_text(json.dumps({"name": "m", "tables": [_table(num_embeddings=0)]}))
    with pytest.raises(ConfigError, match=rf"^{at}: table 'C1': num_embeddings must be a pos"):
        load_spec(path)
    path.write_text(json.dumps({"name": "m", "tables": {"C1": _table()}}))
    with pytest.raises(ConfigError, match=rf"^{at}: field 'tables' must be a list"):
        load_spec(path)
    path.write_text(json.dumps({"name": "m", "tables": [_table()], "id_distribution": "zipf"}))
    with pytest.raises(ConfigError, match=rf"^{at}: field 'id_distribution' must be an obj"):
        load_spec(path)
