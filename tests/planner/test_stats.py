"""Statistics: real Criteo sample, synthetic data, analytic fallback, JSON round trip."""

from __future__ import annotations

from pathlib import Path

import pytest

from lightning_embark.cli import embark_stats as cli_stats
from lightning_embark.errors import ConfigError
from lightning_embark.planner._stats import DataStats, FeatureStats, from_spec, from_synthetic
from lightning_embark.spec import IdDistribution, ModelSpec, TableSpec

CRITEO = (
    Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "criteo-autorec-train-10k.txt"
)


def _spec(kind: str) -> ModelSpec:
    tables = tuple(
        TableSpec(name=f"f{i}", num_embeddings=20_000, embedding_dim=8, pooling_factor=4.0)
        for i in range(2)
    )
    return ModelSpec(name="s", tables=tables, id_distribution=IdDistribution(kind=kind, alpha=1.2))


def test_zipf_has_lower_unique_ratio_than_uniform() -> None:
    uniform = from_synthetic(_spec("uniform"), batch_size=512, num_batches=3)
    zipf = from_synthetic(_spec("zipf"), batch_size=512, num_batches=3)
    for name in ("f0", "f1"):
        assert zipf.features[name].unique_ratio < uniform.features[name].unique_ratio
        assert uniform.features[name].hotness == pytest.approx(4.0)
    assert uniform.measured and uniform.num_batches == 3


@pytest.mark.parametrize("kind", ["uniform", "zipf"])
def test_analytic_estimate_matches_generator(kind: str) -> None:
    spec = _spec(kind)
    measured = from_synthetic(spec, batch_size=512, num_batches=3)
    analytic = from_spec(spec, batch_size=512)
    assert not analytic.measured and "not measured" in analytic.source
    for name in ("f0", "f1"):
        assert analytic.features[name].unique_ratio == pytest.approx(
            measured.features[name].unique_ratio, abs=0.03
        )


def test_json_round_trip(tmp_path: Path) -> None:
    stats = from_spec(_spec("zipf"), batch_size=128)
    stats.save(tmp_path / "s.json")
    assert DataStats.load(tmp_path / "s.json") == stats


def test_invalid_values_are_named() -> None:
    with pytest.raises(ConfigError, match="unique_ratio"):
        FeatureStats(hotness=1.0, unique_ratio=1.5)
    with pytest.raises(ConfigError, match="batch_size"):
        DataStats(batch_size=0)


def test_missing_features_fall_back_to_the_spec() -> None:
    spec = _spec("uniform")
    partial = DataStats(
        batch_size=64, features={"f0": FeatureStats(hotness=2.0, unique_ratio=0.5)}
    )
    got = partial.for_spec(spec)
    assert got[0].hotness == 2.0 and got[1].hotness == 4.0


@pytest.mark.skipif(not CRITEO.is_file(), reason="shared Criteo sample absent")
def test_criteo_sample_cli(tmp_path: Path) -> None:
    out = tmp_path / "criteo.json"
    assert (
        cli_stats.main(
            [
                "--data",
                str(CRITEO),
                "--batch-size",
                "1024",
                "--num-batches",
                "4",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    stats = DataStats.load(out)
    assert len(stats.features) == 26 and stats.num_batches == 4
    assert all(0 < f.unique_ratio <= 1 and 0 < f.hotness <= 1 for f in stats.features.values())
    # low-cardinality features repeat a lot within a batch
    assert min(f.unique_ratio for f in stats.features.values()) < 0.05


def test_synthetic_cli(tmp_path: Path, capsys) -> None:
    out = tmp_path / "s.json"
    code = cli_stats.main(
        ["--model", "demo-small", "--batch-size", "64", "--num-batches", "2", "--out", str(out)]
    )
    assert code == 0 and DataStats.load(out).batch_size == 64
    assert cli_stats.main(["--batch-size", "64", "--out", str(out)]) == 2
    assert "give --data" in capsys.readouterr().err


def test_probes_module_does_not_shadow_the_package_exports() -> None:
    import lightning_embark.planner as planner
    from lightning_embark.planner._stats import measure

    assert (
        planner.measure is measure
    )  # a submodule named like an export would replace it once imported
