"""embark-plan smoke tests: JSON layout, printed report, plot, torchrec comparison."""

from __future__ import annotations

import json
from pathlib import Path

from lightning_embark.cli import embark_plan as cli_plan
from lightning_embark.plan._types import Plan
from lightning_embark.planner._hardware import load_calibration
from lightning_embark.spec import load_spec

#: Seconds a plan of these small models may take (greedy or torchrec's greedy proposer).
PLANNING_BUDGET_S = 5.0


def test_plan_json_and_report(tmp_path: Path, capsys) -> None:
    out = tmp_path / "plan.json"
    code = cli_plan.main(
        [
            "--model",
            "mlperf-dlrm-dcnv2",
            "--max-rows",
            "100000",
            "--topology",
            "emulated",
            "--hosts",
            "2",
            "--ranks-per-host",
            "2",
            "--batch-size",
            "256",
            "--allow",
            "fp16,int8",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    doc = json.loads(out.read_text())
    plan = Plan.from_dict(doc)
    plan.validate(load_spec("mlperf-dlrm-dcnv2", max_rows=100_000))
    assert doc["estimate"]["step_time_ms"] > 0 and len(doc["estimate"]["per_rank"]) == 4
    # The greedy planner takes about 0.06 s here on a 2-core machine (1,000 tables on 128
    # ranks take about 1 s, benchmarks/planner_speed.py): the budget is 80 times that.
    assert 0 < doc["planning_seconds"] < PLANNING_BUDGET_S and "compare" not in doc
    printed = capsys.readouterr().out
    assert "estimated step" in printed and "C1" in printed and "total ms" in printed


def test_compare_torchrec_and_plot(tmp_path: Path) -> None:
    out, png = tmp_path / "plan.json", tmp_path / "plan.png"
    calib = load_calibration("emulated")
    calib.save(tmp_path / "calib.json")
    code = cli_plan.main(
        [
            "--model",
            "demo-small",
            "--topology",
            str(tmp_path / "calib.json"),
            "--hosts",
            "2",
            "--ranks-per-host",
            "2",
            "--batch-size",
            "128",
            "--compare",
            "torchrec",
            "--torchrec-proposer",
            "greedy",
            "--plot",
            str(png),
            "--out",
            str(out),
        ]
    )
    assert code == 0
    doc = json.loads(out.read_text())
    theirs = doc["compare"]["torchrec"]
    assert Plan.from_dict(theirs["plan"]).world_size == 4
    assert theirs["estimate"]["step_time_ms"] > 0
    assert 0 < doc["planning_seconds"] < PLANNING_BUDGET_S  # about 0.03 s
    assert 0 < theirs["planning_seconds"] < PLANNING_BUDGET_S  # torchrec's greedy: about 0.14 s
    assert png.stat().st_size > 10_000


def test_errors_exit_2(tmp_path: Path, capsys) -> None:
    code = cli_plan.main(
        ["--model", "no-such-model", "--batch-size", "8", "--out", str(tmp_path / "x.json")]
    )
    assert code == 2 and "unknown model preset" in capsys.readouterr().err
    code = cli_plan.main(
        [
            "--model",
            "demo-small",
            "--batch-size",
            "8",
            "--allow",
            "fp4",
            "--out",
            str(tmp_path / "x.json"),
        ]
    )
    assert code == 2 and "--allow" in capsys.readouterr().err


def _args(out: Path, *extra: str, hosts: str = "2") -> list[str]:
    return [
        *("--model", "demo-small", "--topology", "emulated", "--hosts", hosts),
        *("--ranks-per-host", "2", "--batch-size", "256", "--allow", "fp16"),
        *extra,
        *("--out", str(out)),
    ]


def test_a_given_plan_is_estimated_not_replanned(tmp_path: Path, capsys) -> None:
    """``--plan FILE`` reads the plan (say embark-tune's best), checks it against the model
    and cluster and estimates it: the greedy plan read back gives the same plan and the
    same estimate, to the last bit (same arithmetic on the same plan)."""
    first, second = tmp_path / "greedy.json", tmp_path / "again.json"
    assert cli_plan.main(_args(first)) == 0
    capsys.readouterr()
    assert cli_plan.main(_args(second, "--plan", str(first))) == 0
    assert f"plan {first}" in capsys.readouterr().out
    a, b = json.loads(first.read_text()), json.loads(second.read_text())
    assert Plan.from_dict(a).to_dict() == Plan.from_dict(b).to_dict()
    assert a["estimate"]["step_time_ms"] == b["estimate"]["step_time_ms"]
    assert b["planning_seconds"] == 0.0


def test_a_given_plan_for_another_cluster_is_refused(tmp_path: Path, capsys) -> None:
    plan_file = tmp_path / "two-hosts.json"
    assert cli_plan.main(_args(plan_file)) == 0
    capsys.readouterr()
    out = tmp_path / "three-hosts.json"
    assert cli_plan.main(_args(out, "--plan", str(plan_file), hosts="3")) == 2
    err = capsys.readouterr().err
    assert f"embark-plan: error: --plan {plan_file}: plan is for 4 ranks" in err
    assert not out.exists()


def _near_limit(tmp_path: Path) -> list[str]:
    """One 1M x 64 table (256 MB of weights) on 2 ranks of 200 MB each: row-wise Adagrad's
    4 MB of state fits beside it, Adagrad's 256 MB (a float per element) does not."""
    spec = tmp_path / "near-limit.json"
    table = {"name": "big", "num_embeddings": 1_000_000, "embedding_dim": 64, "pooling_factor": 1}
    spec.write_text(json.dumps({"name": "near-limit", "tables": [table]}))
    calib = load_calibration("emulated").to_dict() | {"memory_per_rank": 200e6}
    topology = tmp_path / "calib.json"
    topology.write_text(json.dumps(calib))
    return [
        "--model",
        str(spec),
        "--topology",
        str(topology),
        "--hosts",
        "1",
        "--ranks-per-host",
        "2",
        "--batch-size",
        "64",
    ]


def test_the_sparse_optimizer_decides_whether_a_near_limit_model_fits(
    tmp_path: Path, capsys
) -> None:
    base = _near_limit(tmp_path)
    out = tmp_path / "plan.json"
    assert cli_plan.main([*base, "--out", str(out)]) == 0  # default: rowwise_adagrad
    doc = json.loads(out.read_text())
    assert doc["sparse_optimizer"] == "rowwise_adagrad"
    assert doc["calibration"]["optimizer_bytes_per_row"] == 4.0
    assert doc["calibration"]["optimizer_bytes_per_element"] == 0.0
    assert cli_plan.main([*base, "--sparse-optimizer", "sgd", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["calibration"]["optimizer_bytes_per_row"] == 0.0
    capsys.readouterr()
    refused = tmp_path / "refused.json"
    assert cli_plan.main([*base, "--sparse-optimizer", "adagrad", "--out", str(refused)]) == 2
    err = capsys.readouterr().err
    assert "table 'big' does not fit" in err
    assert "memory includes the sparse optimizer's state for --sparse-optimizer adagrad" in err
    assert "adagrad keeps 4 bytes of state per element, doubling each row" in err
    assert "rowwise_adagrad keeps 4 bytes of state per row" in err
    assert not refused.exists()
    # The plan made for SGD is refused too when training will use Adagrad.
    assert (
        cli_plan.main(
            [*base, "--sparse-optimizer", "adagrad", "--plan", str(out), "--out", str(refused)]
        )
        == 2
    )
    assert "--sparse-optimizer adagrad" in capsys.readouterr().err


def test_towers_plan_beside_the_flat_one_and_written_as_towers_json(
    tmp_path: Path, capsys
) -> None:
    from lightning_embark.plan import TowerModule, load_towers

    out, towers = tmp_path / "plan.json", tmp_path / "towers.json"
    args = ["--model", "demo-small", "--hosts", "2", "--ranks-per-host", "2"]
    code = cli_plan.main(
        [
            *args,
            "--batch-size",
            "512",
            "--towers",
            "auto",
            "--tower-module",
            "projection",
            "--tower-ratio",
            "4",
            "--compare",
            "flat",
            "--towers-out",
            str(towers),
            "--out",
            str(out),
        ]
    )
    assert code == 0
    doc = json.loads(out.read_text())
    plan = Plan.from_dict(doc)
    assert {t.host for t in plan.towers} == {0, 1}
    assert all(t.module is TowerModule.PROJECTION for t in plan.towers)
    requests = load_towers(towers)
    assert [set(r.tables) for r in requests] == [set(t.tables) for t in plan.towers]
    flat = Plan.from_dict(doc["compare"]["flat"]["plan"])
    assert not flat.towers and doc["compare"]["flat"]["estimate"]["step_time_ms"] > 0
    printed = capsys.readouterr().out
    assert "tower tower0 on host" in printed and "towers / flat estimated step time" in printed


def test_tower_options_are_checked(tmp_path: Path, capsys) -> None:
    base = ["--model", "demo-small", "--batch-size", "64", "--out", str(tmp_path / "p.json")]
    for extra, message in (
        (["--tower-ratio", "4"], "need --towers"),
        (["--compare", "flat"], "add --towers"),
        (["--towers", "2", "--tower-module", "dcn"], "needs --tower-ratio"),
        (["--towers", "2", "--tower-ratio", "2"], "needs a compressing --tower-module"),
        (["--towers", "many"], "neither 'auto', a tower count nor an existing"),
        (["--compare", "hugectr"], "unknown ['hugectr']"),
    ):
        assert cli_plan.main([*base, *extra]) == 2
        assert message in capsys.readouterr().err
    assert not (tmp_path / "p.json").exists()


def test_towers_auto_prints_the_comparison_and_records_it(tmp_path: Path, capsys) -> None:
    """``--towers auto``: the cost model's choice among flat, identity towers and the
    compressing settings shown to keep accuracy, every candidate printed with its
    estimate, the choice in the plan JSON, the chosen towers in ``--towers-out``; where
    flat is cheaper (MLPerf on 2 x 2 at batch 1024: the tower modules' compute outweighs
    the link) the towers file holds no towers."""
    from lightning_embark.plan import load_towers

    def plan(model: str, *extra: str) -> tuple[dict, str, list]:
        out, towers = tmp_path / f"{model}.json", tmp_path / f"{model}-towers.json"
        argv = [
            "--model",
            model,
            "--hosts",
            "2",
            "--ranks-per-host",
            "2",
            "--batch-size",
            "1024",
            "--towers",
            "auto",
            "--towers-out",
            str(towers),
            "--out",
            str(out),
            *extra,
        ]
        assert cli_plan.main(argv) == 0
        return json.loads(out.read_text()), capsys.readouterr().out, load_towers(towers)

    doc, printed, requests = plan("demo-small")
    choice = Plan.from_dict(doc).tower_choice
    assert choice is not None and choice.chosen != "flat"
    assert choice.candidates[0].label == "flat"
    assert (
        "est. step ms" in printed
        and "<- chosen" in printed
        and f"towers: {choice.chosen}" in printed
    )
    assert len(requests) == len(doc["towers"]) > 0
    doc, printed, requests = plan("mlperf-dlrm-dcnv2", "--max-rows", "100000")
    assert doc["tower_choice"]["chosen"] == "flat" and not doc["towers"] and requests == []
    assert "no towers: the model stays flat" in printed
