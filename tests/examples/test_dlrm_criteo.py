"""``examples/dlrm_criteo.py``: the LightningCLI recipe, single process and on 2 emulated hosts x
2 ranks.

The single-process runs check that each strategy trains and validates through the CLI;
the multi-node run launches ``Trainer(strategy="embark", num_nodes=2, devices=2)`` with
torchrun on every emulated host, as a user would on a real cluster.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_embark.emulation import EmulatedHosts, EmulationConfig
from lightning_embark.emulation._netns import netns_unavailable_reason
from lightning_embark.testing._ranks import load_module

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "examples" / "dlrm_criteo.py"
DATA = REPO.parent / "shared" / "data" / "criteo-autorec-train-10k.txt"
TEST_PREFIX = "embtest-"  # as tests/cluster: names the namespaces tests create

needs_data = pytest.mark.skipif(
    not DATA.is_file(), reason=f"the Criteo sample {DATA} is not present"
)
REASON = netns_unavailable_reason()
needs_netns = pytest.mark.skipif(
    REASON is not None, reason=f"emulated cluster needs root and iproute2: {REASON}"
)

STEPS = 2
#: A few steps, validation on a couple of batches right after them, nothing written but the report.
QUICK = [
    "--trainer.max_steps",
    str(STEPS),
    "--trainer.val_check_interval",
    str(STEPS),
    "--trainer.limit_val_batches",
    "2",
    "--trainer.logger",
    "false",
    "--trainer.enable_progress_bar",
    "false",
    "--trainer.enable_model_summary",
    "false",
    "--data.num_embeddings",
    "2000",
]


def _records(out: Path, world: int) -> list[dict]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


def _check_trained(record: dict) -> None:
    assert record["global_step"] == STEPS
    assert len(record["losses"]) == STEPS and record["all_losses_finite"]
    assert all(math.isfinite(x) and x > 0 for x in record["losses"])
    assert len(record["step_seconds"]) == STEPS
    assert 0.0 <= record["validation"]["val_auc"] <= 1.0
    assert math.isfinite(record["validation"]["val_loss"])


#: Runs the recipe's ``main`` once per strategy in one process (one import of torch,
#: Lightning and torchrec instead of one per strategy): argv[1] strategies, argv[2] the
#: common arguments as JSON, argv[3] the report folder of each run ({strategy} replaced).
DRIVER = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("dlrm_criteo", sys.argv[4])
recipe = importlib.util.module_from_spec(spec)
spec.loader.exec_module(recipe)
for strategy in sys.argv[1].split(","):
    recipe.main(["fit", "--trainer.strategy", strategy, *json.loads(sys.argv[2]),
                 "--report_dir", sys.argv[3].format(strategy=strategy)])
"""
STRATEGIES = {"embark": "EmbarkStrategy", "ddp": "DDPStrategy", "torchrec": "TorchrecStrategy"}


@needs_data
def test_recipe_runs_single_process_with_each_strategy(tmp_path: Path) -> None:
    common = [
        "--data.path",
        str(DATA),
        "--data.batch_size",
        "64",
        "--trainer.default_root_dir",
        str(tmp_path),
        *QUICK,
    ]
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            DRIVER,
            ",".join(STRATEGIES),
            json.dumps(common),
            str(tmp_path / "{strategy}"),
            str(RECIPE),
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert result.stdout.count(f"[dlrm_criteo] {STEPS} steps on 1 rank(s): val_auc ") == len(
        STRATEGIES
    )
    for strategy, cls in STRATEGIES.items():
        (record,) = _records(tmp_path / strategy, 1)
        assert record["strategy"] == cls
        assert (
            record["rank"],
            record["world_size"],
            record["num_nodes"],
            record["batch_size"],
        ) == (0, 1, 1, 64)
        _check_trained(record)
        if strategy == "embark":
            assert "C1:" in record["plan_summary"]


def test_recipe_cli_links_table_rows_and_defaults(tmp_path: Path) -> None:
    recipe = load_module(RECIPE, "_dlrm_criteo_under_test")
    data = tmp_path / "tiny.txt"
    data.write_text("0" + "\t" * 39 + "\n")  # one valid Criteo line: every feature empty
    cli = recipe.main(
        [
            "--data.path",
            str(data),
            "--data.num_embeddings",
            "500",
            "--model.interaction",
            "dcn",
            "--trainer.logger",
            "false",
        ],
        run=False,
    )
    assert cli.model.spec.tables[0].num_embeddings == 500 and cli.datamodule.num_embeddings == 500
    assert cli.model.config.interaction == "dcn" and cli.model.config.dense_arch_layer_sizes == (
        64,
        16,
    )
    assert cli.datamodule.batch_size == recipe.RECIPE_BATCH_SIZE
    assert cli.trainer.checkpoint_callback is None  # off unless asked for


@pytest.mark.netns
@pytest.mark.multiprocess
@needs_netns
@needs_data
def test_recipe_on_two_emulated_hosts_with_num_nodes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "report"
    config = EmulationConfig(num_hosts=2, ranks_per_host=2, rate_mbit=800, name_prefix=TEST_PREFIX)
    with EmulatedHosts(config, require_netns=True) as cluster:
        rc = cluster.run(
            [
                str(RECIPE),
                "fit",
                "--data.path",
                str(DATA),
                "--data.batch_size",
                "32",
                "--trainer.strategy",
                "embark",
                "--trainer.num_nodes",
                "2",
                "--trainer.devices",
                "2",
                "--trainer.default_root_dir",
                str(tmp_path),
                *QUICK,
                "--report_dir",
                str(out),
            ],
            env={"OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"},
        )
    output = capsys.readouterr().out
    assert rc == 0, output[-4000:]
    records = _records(out, 4)
    assert [r["rank"] for r in records] == [0, 1, 2, 3]
    assert {r["world_size"] for r in records} == {4}
    assert {(r["num_nodes"], r["num_devices"]) for r in records} == {(2, 2)}
    assert [r["node_rank"] for r in records] == [0, 0, 1, 1]
    assert [r["torchrun_group_rank"] for r in records] == [
        "0",
        "0",
        "1",
        "1",
    ]  # torchrun's node rank agrees
    assert [r["local_rank"] for r in records] == [0, 1, 0, 1]
    assert [r["host"] for r in records] == [0, 0, 1, 1]
    assert {r["strategy"] for r in records} == {"EmbarkStrategy"}
    for record in records:
        _check_trained(record)
        # Embedding all-to-alls and the dense all-reduce cross the emulated hosts.
        assert all(step["inter_host"] > 0 for step in record["comm"])
    # One metric over every rank's validation predictions: the same value everywhere.
    assert len({r["validation"]["val_auc"] for r in records}) == 1
    assert records[0]["plan_summary"].startswith("topology emulated: 2 host(s) x 2 rank(s)")
    assert "[host 0] [dlrm_criteo] 2 steps on 4 rank(s): val_auc" in output


def test_predict_writes_a_probability_per_line(tmp_path: Path) -> None:
    """``dlrm_criteo.py predict`` on a Criteo file: one ``label,probability`` row per line."""
    recipe = load_module(RECIPE, "_dlrm_criteo_under_test")
    data = tmp_path / "tiny.txt"
    labels = [i % 2 for i in range(7)]
    data.write_text(
        "".join(
            "\t".join([str(y), *(str(i) for i in range(13)), *(f"{j:08x}" for j in range(26))])
            + "\n"
            for y in labels
        )
    )
    out = tmp_path / "predictions.csv"
    recipe.main(
        [
            "predict",
            "--data.path",
            str(data),
            "--data.batch_size",
            "3",
            "--data.num_embeddings",
            "100",
            "--trainer.logger",
            "false",
            "--trainer.enable_progress_bar",
            "false",
            "--predictions",
            str(out),
        ]
    )
    lines = out.read_text().splitlines()
    assert lines[0] == "label,probability" and len(lines) == 1 + len(labels)
    assert [int(line.split(",")[0]) for line in lines[1:]] == labels
    assert all(0.0 < float(line.split(",")[1]) < 1.0 for line in lines[1:])
