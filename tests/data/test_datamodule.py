"""CriteoDataModule on the real Criteo sample: split, per-rank sharding, validation coverage."""

from __future__ import annotations

from itertools import islice
from pathlib import Path
from types import SimpleNamespace

import pytest

from lightning_embark.data._datamodule import CriteoDataModule
from lightning_embark.errors import ConfigError, DataFormatError

SAMPLE = "criteo-autorec-train-10k.txt"


@pytest.fixture
def criteo(shared_file) -> Path:
    return shared_file(SAMPLE)


def _module(path: Path, **kwargs) -> CriteoDataModule:
    kwargs.setdefault("num_embeddings", 1000)
    return CriteoDataModule(str(path), **kwargs)


def test_ranks_see_the_single_process_global_batches(criteo: Path, as_rows) -> None:
    world, per_rank = 4, 32
    steps = 3  # the first chunk of the file is enough; parsing it all per rank is slow
    single = list(
        islice(
            _module(criteo, batch_size=world * per_rank).dataset("train", rank=0, world_size=1),
            steps,
        )
    )
    ranks = [
        list(
            islice(
                _module(criteo, batch_size=per_rank).dataset("train", rank=r, world_size=world),
                steps,
            )
        )
        for r in range(world)
    ]
    for step in range(steps):
        assert as_rows([ranks[r][step] for r in range(world)]) == as_rows([single[step]])


def test_split_is_80_20_disjoint_and_validation_keeps_every_line(criteo: Path, as_rows) -> None:
    module = _module(criteo, batch_size=64)
    train = as_rows(list(module.dataset("train", rank=0, world_size=1)))
    world = 2  # ~2,000 validation lines do not fill the last global batch of 2 x 64
    val = [list(module.dataset("val", rank=r, world_size=world)) for r in range(world)]
    assert len({len(batches) for batches in val}) == 1, (
        "every rank runs the same number of validation steps"
    )
    val_rows = as_rows([b for batches in val for b in batches])
    assert (
        1800 < len(val_rows) < 2200 and len(train) + len(val_rows) > 9900
    )  # train drops < 1 global batch
    assert len(train) % 64 == 0
    assert not set(val_rows) & set(train)


def test_loaders_follow_the_trainers_rank(criteo: Path, as_rows) -> None:
    module = _module(criteo, batch_size=16)
    module.trainer = SimpleNamespace(
        global_rank=1, world_size=2
    )  # what setup sees under a Trainer
    first = next(iter(module.train_dataloader()))
    expected = next(iter(module.dataset("train", rank=1, world_size=2)))
    assert as_rows([first]) == as_rows([expected])
    val = module.val_dataloader().dataset
    assert (val.split, val.rank, val.world_size, val.drop_last) == ("val", 1, 2, False)
    assert module.train_dataloader().dataset.drop_last


def test_bad_arguments_are_clear_errors(criteo: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"does not exist.*--data\.path"):
        CriteoDataModule(str(tmp_path / "absent.txt"))
    with pytest.raises(ConfigError, match="batch_size"):
        _module(criteo, batch_size=0)
    with pytest.raises(ConfigError, match="val_fraction"):
        _module(criteo, val_fraction=1.5)
    with pytest.raises(ConfigError, match="num_workers"):
        _module(criteo, num_workers=-1)


def test_a_file_skipped_whole_fails_the_loader_instead_of_an_empty_run(tmp_path: Path) -> None:
    # Criteo lines with a comma where the tab belongs: every one is malformed.
    fields = ["1", *(str(i) for i in range(13)), *("deadbeef" for _ in range(26))]
    path = tmp_path / "commas.txt"
    path.write_text("".join(",".join(fields) + "\n" for _ in range(30)))
    module = _module(path, batch_size=4, on_error="skip", max_skip_fraction=1.0)
    with pytest.raises(DataFormatError, match=r"every one of its 30 data lines is malformed"):
        list(module.train_dataloader())
    with pytest.raises(ConfigError, match="max_skip_fraction"):
        _module(path, on_error="skip", max_skip_fraction=2)


def test_predict_reads_every_line_in_order_and_the_spec_matches_the_tables(
    tmp_path: Path, as_rows
) -> None:
    """20 Criteo lines on 3 ranks x 4: predict covers all of them (the last global batch
    of 8 split 3/3/2), batch by batch, rank by rank, in file order."""
    fields = [*(str(i) for i in range(13)), *("deadbeef" for _ in range(26))]
    path = tmp_path / "criteo.txt"
    path.write_text("".join("\t".join([str(i % 2), *fields]) + "\n" for i in range(20)))
    world = 3
    ranks = []
    for rank in range(world):
        module = _module(path, batch_size=4)
        module.trainer = SimpleNamespace(global_rank=rank, world_size=world)
        ranks.append(list(module.predict_dataloader()))
    assert {len(batches) for batches in ranks} == {2}
    in_order = as_rows([ranks[r][b] for b in range(2) for r in range(world)])
    assert [row[1] for row in in_order] == [float(i % 2) for i in range(20)]
    spec = _module(path, num_embeddings=300).model_spec()
    assert [t.name for t in spec.tables] == [f"C{i}" for i in range(1, 27)]
    assert {t.num_embeddings for t in spec.tables} == {300} and spec.num_dense_features == 13
