"""``examples/dlrm_ctr.py``: the LightningCLI recipe on a CSV that is not Criteo's layout.

Every run starts gloo ranks (``run_gloo_ranks``) that call the recipe's ``main`` as a
user's command line would, each in its own process: sharded training (``--trainer.strategy
embark``) on 2 and 4 ranks against one process, ``predict``, and a malformed line.
"""

from __future__ import annotations

import csv
import json
import logging
import math
import random
from pathlib import Path

import pytest
import torch

from lightning_embark.data import DelimitedDataset
from lightning_embark.errors import DataFormatError
from lightning_embark.testing import load_module, run_gloo_ranks

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "examples" / "dlrm_ctr.py"
NAME = "_dlrm_ctr_under_test"

SITES = [f"site-{i}" for i in range(40)]
DEVICES = ["ios", "android", "web", "tv"]
CITIES = [f"city {i}" for i in range(25)]
#: 640 data lines: ~512 training lines (8 global batches of 64) and ~128 validation lines.
NUM_LINES = 640
GLOBAL_BATCH = 64
ROWS = 97  # hashed rows per table: collisions among the 40 sites are fine


def write_clicks(path: Path, *, dense: bool, bad_line: int | None = None) -> list[int]:
    """A CSV with a header, a 0/1 ``clicked`` label, string categoricals (site, device,
    city) and, with ``dense``, two numeric columns (price, age); returns the labels.

    Clicks follow a fixed logistic teacher over the site, the device and the price, so
    a few steps learn something and the validation AUC is not a coin toss. With
    ``bad_line`` (1-based file line, header = 1), that line's label is ``maybe``.
    """
    rng = random.Random(7)
    site_weight = {s: rng.uniform(-2.0, 2.0) for s in SITES}
    device_weight = dict(zip(DEVICES, (0.8, -0.4, 0.0, -1.0), strict=True))
    header = ["clicked", *(["price", "age"] if dense else []), "site", "device", "city"]
    labels = []
    with path.open("w", newline="") as handle:
        out = csv.writer(handle)
        out.writerow(header)
        for line in range(2, NUM_LINES + 2):
            site, device, city = rng.choice(SITES), rng.choice(DEVICES), rng.choice(CITIES)
            price, age = round(rng.uniform(0.0, 100.0), 2), rng.randint(18, 80)
            logit = site_weight[site] + device_weight[device] + (price - 50.0) / 25.0
            label = int(rng.random() < 1.0 / (1.0 + math.exp(-logit)))
            labels.append(label)
            row = ["maybe" if line == bad_line else label, *([price, age] if dense else [])]
            out.writerow([*row, site, device, city])
    return labels


def _args(path: Path, root: Path, *, dense: bool) -> list[str]:
    return [
        "--data.path",
        str(path),
        "--data.delimiter",
        ",",
        "--data.header",
        "true",
        "--data.label",
        "clicked",
        "--data.dense",
        "price,age" if dense else "",  # comma lists, as a user types them
        "--data.categorical_encoding",
        "string",
        "--data.num_embeddings",
        str(ROWS),
        "--trainer.logger",
        "false",
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.enable_model_summary",
        "false",
        "--trainer.default_root_dir",
        str(root),
    ]


def _fit_and_predict(rank: int, world_size: int, args: list[str], out: str) -> None:
    """One rank: fit through the recipe's command line, then predict with the trained
    model, writing ``out/predictions.csv``."""
    recipe = load_module(RECIPE, NAME)
    strategy = "embark" if world_size > 1 else "auto"
    cli = recipe.main(
        [
            "fit",
            *args,
            "--trainer.strategy",
            strategy,
            "--trainer.devices",
            str(world_size),
            "--data.batch_size",
            str(GLOBAL_BATCH // world_size),
            "--model.materialize_tables",
            "true",
            "--report_dir",
            out,
            "--predictions",
            str(Path(out) / "predictions.csv"),
        ]
    )
    assert type(cli.trainer.strategy).__name__ == (
        "EmbarkStrategy" if world_size > 1 else "SingleDeviceStrategy"
    )
    cli.trainer.predict(cli.model, datamodule=cli.datamodule, return_predictions=False)


def _predictions(path: Path) -> tuple[list[int], list[float]]:
    with path.open() as handle:
        rows = list(csv.DictReader(handle))
    return [int(float(r["label"])) for r in rows], [float(r["probability"]) for r in rows]


@pytest.mark.multiprocess
def test_embark_on_2_and_4_ranks_matches_single_process_auc(tmp_path: Path) -> None:
    """Validation AUC of ``--trainer.strategy embark`` on 2 and 4 gloo ranks equals one
    process's within 0.002; ``predict`` on the sharded ranks writes every line in order.

    Why 0.002 holds: the runs train on the same global batches of 64 (the data module's
    sharding rule) from the same weights (``--model.materialize_tables``: seeded tables
    that embark slices from rank 0), and the strategy averages embedding gradients
    like DDP does dense ones, so sharded training is single-process training up to the
    order of fp32 sums: predictions differ by rounding, ~1e-6 relative after 8 steps.
    AUC is the share of (click, non-click) pairs in the right order; only a pair whose
    two scores lie within that rounding can swap. Here every score is distinct (a
    continuous price per line) and ~128 scores spread over ~0.5 leave gaps of ~4e-3,
    three orders of magnitude above the rounding, so the expected number of swaps is
    far below one, while 0.002 allows ~0.002 x 64 x 64 = 8 swapped pairs.
    """
    data = tmp_path / "clicks.csv"
    labels = write_clicks(data, dense=True)
    args = _args(data, tmp_path, dense=True)
    auc, steps = {}, set()
    for world in (1, 2, 4):
        out = tmp_path / f"w{world}"
        run_gloo_ranks(_fit_and_predict, world, args, str(out))
        records = [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]
        steps |= {r["global_step"] for r in records}
        assert all(r["all_losses_finite"] for r in records)
        # One metric over every rank's predictions: the same value on every rank.
        assert len({r["validation"]["val_auc"] for r in records}) == 1
        auc[world] = records[0]["validation"]["val_auc"]
        written, probabilities = _predictions(out / "predictions.csv")
        assert written == labels, "predict must write every line once, in file order"
        assert all(0.0 < p < 1.0 for p in probabilities)
    assert len(steps) == 1 and steps.pop() >= 6  # ~512 training lines in batches of 64
    assert auc[1] > 0.6, f"the teacher is learnable; single-process AUC {auc[1]:.4f}"
    assert abs(auc[2] - auc[1]) <= 0.002, auc
    assert abs(auc[4] - auc[1]) <= 0.002, auc


def _predict(rank: int, world_size: int, args: list[str], out: str) -> None:
    """``dlrm_ctr.py predict`` with an untrained model, then the same model on the whole
    file as one batch."""
    recipe = load_module(RECIPE, NAME)
    path = Path(out) / "predictions.csv"
    cli = recipe.main(["predict", *args, "--data.batch_size", "50", "--predictions", str(path)])
    assert cli.model.spec.num_dense_features == 0
    assert [t.name for t in cli.model.spec.tables] == ["site", "device", "city"]
    assert {t.num_embeddings for t in cli.model.spec.tables} == {ROWS}
    whole = DelimitedDataset(
        cli.datamodule.path,
        cli.datamodule.fmt,
        num_embeddings=ROWS,
        batch_size=NUM_LINES,
        split="all",
        drop_last=False,
    )
    (batch,) = list(whole)
    with torch.no_grad():
        expected = torch.sigmoid(cli.model(batch.dense_features, batch.sparse_features))
    torch.save(expected, Path(out) / "expected.pt")


@pytest.mark.multiprocess
def test_predict_writes_a_probability_per_line_in_file_order(tmp_path: Path) -> None:
    """``predict`` on all-categorical data (no dense column) writes ``label,probability``
    for every line, in file order, and the probabilities are the model's.

    The writer's probabilities come from batches of 50 (the last one short), the
    reference from one batch of 640: the same per-example arithmetic, but the MLPs'
    matrix products may block a batch differently, which moves a logit by the rounding
    of a dot product of <= 64 terms, ~64 x 6e-8 relative; probabilities of logits
    within |x| < 5 then agree to far better than 1e-5.
    """
    data = tmp_path / "clicks.csv"
    labels = write_clicks(data, dense=False)
    run_gloo_ranks(_predict, 1, _args(data, tmp_path, dense=False), str(tmp_path))
    written, probabilities = _predictions(tmp_path / "predictions.csv")
    assert written == labels
    expected = torch.load(tmp_path / "expected.pt")
    assert torch.allclose(torch.tensor(probabilities), expected, atol=1e-5, rtol=0)


def _fit_bad_file(rank: int, world_size: int, args: list[str]) -> None:
    recipe = load_module(RECIPE, NAME)
    warned: list[str] = []

    class Warnings(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno >= logging.WARNING:
                warned.append(record.getMessage())

    handler = Warnings()
    logging.getLogger("lightning_embark").addHandler(handler)
    with pytest.raises(DataFormatError, match=r"line 6: column 'clicked' \(index 0\)") as error:
        recipe.main(["fit", *args, "--trainer.strategy", "embark", "--data.batch_size", "16"])
    assert "maybe" in str(error.value)
    assert not warned, f"the data error was reported as something else first: {warned}"


@pytest.mark.multiprocess
@pytest.mark.parametrize("world", [1, 2])
def test_a_malformed_line_fails_as_a_data_format_error_without_a_warning_first(
    tmp_path: Path, world: int
) -> None:
    """Line 6 of the file has the label ``maybe``: every rank's run fails with the
    DataFormatError naming it (none waits for another), and nothing (the plan's
    statistics sampling included) logs it first."""
    data = tmp_path / "clicks.csv"
    write_clicks(data, dense=True, bad_line=6)
    args = [*_args(data, tmp_path, dense=True), "--trainer.devices", str(world)]
    run_gloo_ranks(_fit_bad_file, world, args)


def test_the_defaults_read_a_criteo_file_and_the_model_follows_the_data(tmp_path: Path) -> None:
    """Without layout options the recipe reads Criteo's layout (40 tab-separated fields, no
    header); with them, the model's tables and dense width are the data's."""
    recipe = load_module(RECIPE, NAME)
    criteo = tmp_path / "criteo.txt"
    criteo.write_text("1\t" + "\t".join(["3"] * 13 + ["deadbeef"] * 26) + "\n")
    cli = recipe.main(["--data.path", str(criteo), "--trainer.logger", "false"], run=False)
    spec = cli.model.spec
    assert [t.name for t in spec.tables] == [f"C{i}" for i in range(1, 27)]
    assert spec.num_dense_features == 13
    assert {t.num_embeddings for t in spec.tables} == {recipe.RECIPE_NUM_EMBEDDINGS}
    assert cli.datamodule.fmt.categorical_encoding == "hex32"
    assert cli.datamodule.batch_size == recipe.RECIPE_BATCH_SIZE

    data = tmp_path / "clicks.csv"
    write_clicks(data, dense=True)
    cli = recipe.main(
        [*_args(data, tmp_path, dense=True), "--model.interaction", "dcn"], run=False
    )
    spec = cli.model.spec
    assert [t.name for t in spec.tables] == ["site", "device", "city"]
    assert spec.num_dense_features == 2
    assert cli.model.config.interaction == "dcn"
    with pytest.raises(DataFormatError, match=r"separated by '\\t'.*--data\.delimiter"):
        recipe.main(["--data.path", str(data), "--trainer.logger", "false"], run=False)


def test_list_options_take_comma_lists_as_they_take_brackets(tmp_path: Path) -> None:
    """``--data.dense price,age`` is ``--data.dense '[price, age]'`` (jsonargparse alone
    reads only the latter), for every list option of the recipe, with ``=`` too; column
    indices stay integers, and an option that takes a string as well is left as typed."""
    recipe = load_module(RECIPE, NAME)
    data = tmp_path / "clicks.csv"
    write_clicks(data, dense=True)
    base = [a for a in _args(data, tmp_path, dense=True) if a not in ("--data.dense", "price,age")]

    def parsed(*options: str) -> tuple[object, ...]:
        config = recipe.main([*base, *options], run=False).config
        return (
            list(config.data.dense),
            list(config.data.categorical),
            tuple(config.model.dense_arch_layer_sizes),
            tuple(config.model.over_arch_layer_sizes),
        )

    commas = parsed(
        *("--data.dense", "price, age", "--data.categorical=site,city"),
        *("--model.dense_arch_layer_sizes", "32,16", "--model.over_arch_layer_sizes", "8,1"),
    )
    brackets = parsed(
        *("--data.dense", "[price, age]", "--data.categorical=[site, city]"),
        *("--model.dense_arch_layer_sizes", "[32, 16]", "--model.over_arch_layer_sizes", "[8, 1]"),
    )
    assert commas == brackets == (["price", "age"], ["site", "city"], (32, 16), (8, 1))
    by_index = recipe.main(
        [*base, "--data.header", "false", "--data.label", "0", "--data.dense", "1,2"], run=False
    )
    assert list(by_index.config.data.dense) == [1, 2]
    assert by_index.datamodule.num_dense_features == 2


def test_a_libfm_file_through_the_data_options(tmp_path: Path) -> None:
    """A positional libFM file (``label index:1 ...``, labels 1 / -1, as Frappe's) trains
    through ``--data`` options alone: three one-hot fields, no dense column, and the
    validation AUC of a teacher that clicks on field 1's even indices is well above 0.5."""
    recipe = load_module(RECIPE, NAME)
    rng = random.Random(3)
    lines = []
    for _ in range(600):
        a, b, c = rng.randrange(0, 20), rng.randrange(20, 30), rng.randrange(30, 35)
        click = (a % 2 == 0) == (rng.random() < 0.9)
        lines.append(f"{1 if click else -1} {a}:1 {b}:1 {c}:1\r\n")
    data = tmp_path / "clicks.libfm"
    data.write_text("".join(lines))
    args = [
        "--data.path",
        str(data),
        "--data.delimiter",
        " ",
        "--data.dense",
        "[]",
        "--data.categorical_encoding",
        "libfm",
        "--data.label_threshold",
        "0.5",
        "--data.num_embeddings",
        "35",
        "--data.batch_size",
        "32",
        "--trainer.max_epochs",
        "3",
        "--trainer.logger",
        "false",
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.enable_model_summary",
        "false",
        "--trainer.default_root_dir",
        str(tmp_path),
        "--model.materialize_tables",
        "true",
    ]
    cli = recipe.main(args, run=False)
    spec = cli.model.spec
    assert [t.name for t in spec.tables] == ["C1", "C2", "C3"]
    assert spec.num_dense_features == 0
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert float(cli.trainer.callback_metrics["val_auc"]) > 0.75
