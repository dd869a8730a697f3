"""``embark-bench --strategies torchrec,embark``: the engine in the same model, data and JSON as
the baseline."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

import pytest

from lightning_embark.accounting import DispatchSnapshot
from lightning_embark.cli.embark_bench import main
from lightning_embark.errors import ConfigError
from lightning_embark.harness import BenchConfig
from lightning_embark.plan._types import Plan
from lightning_embark.planner._rules import rule_based_plan
from lightning_embark.spec import load_spec
from lightning_embark.testing import TINY_BENCH_ARGS

_TINY = list(TINY_BENCH_ARGS)


@pytest.mark.multiprocess
def test_bench_runs_embark_beside_torchrec_with_a_plan_file(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    spec = load_spec("demo-small", max_rows=2000)
    plan = rule_based_plan(spec, (2, 1), allow=["fp16"])
    plan.save(tmp_path / "plan.json")
    out = tmp_path / "r.json"
    code = main(
        [
            *_TINY,
            "--strategies",
            "torchrec,embark",
            "--plan",
            str(tmp_path / "plan.json"),
            "--profile",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    captured = capsys.readouterr()
    printed = captured.out
    assert "embark" in printed
    # One bar per run, drawn by rank 0 a line per redraw; no rank's Lightning bar, whose
    # carriage-return redraws the relay would join into kilobyte-long lines (the profile's
    # tables, rows that start with '|', may be wide).
    lines = (printed + captured.err).splitlines()
    joined = [line for line in lines if len(line) > 200 and not line.startswith("|")]
    assert not joined and not [line for line in lines if "\r" in line]
    assert sum("[progress] torchrec (1/2):" in line for line in lines) >= 2
    assert sum("[progress] embark (2/2):" in line for line in lines) >= 2
    assert not [line for line in lines if "Epoch 0:" in line or "Training:" in line]
    assert "embark: exchange profile against the applied link rate" in printed
    # Quiet logs: the ranks print the strategy, progress and results, no third-party noise.
    noise = (
        "Warning",
        "WARNING",
        "is_fx_tracing",
        "Initializing distributed",
        "Tip:",
        "Connection]",
    )
    assert not [line for line in printed.splitlines() if any(n in line for n in noise)]
    result = json.loads(out.read_text())
    assert (
        result["config"]["plan"] == str((tmp_path / "plan.json").resolve())
        and result["config"]["allow"] == []
    )
    runs = {run["strategy"]: run for run in result["runs"]}
    assert set(runs) == {"torchrec", "embark"}
    for run in runs.values():  # the baseline's schema, field for field
        assert set(runs["torchrec"]) - {"plan_summary"} <= set(run)
        assert set(run["step_time_ms"]) == {"median", "p10", "p90"}
        assert (
            run["samples_per_s"] > 0 and 0.0 <= run["comm_share"] <= 1.0 and run["peak_rss_mb"] > 0
        )
        assert run["num_measured_steps"] == 3
    assert (runs["torchrec"]["dense_compression"], runs["torchrec"]["dense_exchange"]) == (
        "fp32",
        "flat",
    )  # each strategy's own default without --dense-compression
    embark = runs["embark"]
    assert Plan.from_dict(embark["plan"]) == plan
    assert "compression fwd/bwd fp16/fp16" in embark["plan_summary"]
    assert (
        embark["dense_compression"] == "fp32"
    )  # a plan file allows nothing lossy for the dense part
    assert embark["bytes_per_step"]["inter_host"] > 0
    assert "all_to_all_single" in embark["bytes_per_step"]["by_collective"]
    # --profile: both runs count one step's dispatches (on every rank), torchrec's sharded
    # modules and embark's clusters scoped; torchrec's step has syncs of its own too.
    for name, run in runs.items():
        assert [row["rank"] for row in run["dispatch"]] == [0, 1]
        counts = DispatchSnapshot.from_dict(run["dispatch"][0]["counts"])
        assert counts.total_ops > 0 and counts.device_syncs > 0, name
        assert f"{name}: what a GPU would see of step 0" in printed
    embark_scopes = DispatchSnapshot.from_dict(runs["embark"]["dispatch"][0]["counts"])
    assert any(s.endswith(":backward") for s in embark_scopes.ops_by("scope"))
    torchrec_scopes = DispatchSnapshot.from_dict(runs["torchrec"]["dispatch"][0]["counts"])
    assert any(":input_dist" in s for s in torchrec_scopes.ops_by("scope"))
    # --profile: the embark run's exchanges per cluster and phase, the baseline unprofiled.
    assert "profile" not in runs["torchrec"]
    profile = embark["profile"]
    phases = {(row["cluster"], row["phase"]) for row in profile}
    exchanging = {c for c, p in phases if p == "ids"}
    assert exchanging and all(
        {(c, p) for p in ("header", "ids", "rows", "grads")} <= phases for c in exchanging
    ), phases
    by_phase = {(row["cluster"], row["phase"]): row for row in profile}
    for cluster in exchanging:  # one host per rank: every byte of rows and grads crosses
        rows = by_phase[(cluster, "rows")]
        assert rows["inter_host_bytes"] > 0 and rows["link_bytes"] > 0 and rows["ms"] > 0
    rate = result["config"]["rate_mbit"]
    # A share of line rate wherever bytes crossed and the rank waited; an exchange the
    # input pipeline or the overlap hid entirely (no time waited) has none.
    for row in (row for row in profile if row["link_bytes"]):
        waited = row["ms"] > 0
        if rate is None or not waited:
            assert row["efficiency"] is None, row
        else:
            assert row["efficiency"] > 0, row


def _job(config: BenchConfig, strategy: str, tmp_path: Path, label: str | None = None) -> Any:
    """The run as its ranks read it: through its JSON, as the worker gets it."""
    from lightning_embark.harness import RankJob

    job = RankJob(config=config, strategy=strategy, label=label, out_dir=tmp_path)
    return RankJob.from_json(job.to_json())


def _built(config: BenchConfig, strategy: str, tmp_path: Path, label: str | None = None) -> Any:
    """The strategy a rank of that run builds."""
    from lightning_embark.harness import _worker as worker

    return worker.build_strategy(_job(config, strategy, tmp_path, label))


def _dense(strategy: Any) -> str:
    """A built strategy's dense wire format (embark's a Compression, torchrec's a name)."""
    return str(getattr(strategy.dense_compression, "value", strategy.dense_compression))


def test_a_rank_job_round_trips_through_its_json(tmp_path: Path) -> None:
    """The ranks get the bench's config whole (tuples back as tuples, checked again), the
    run's strategy, label, place and directory; the worker takes one file, nothing else."""
    from lightning_embark.harness import RankJob
    from lightning_embark.harness import _worker as worker

    config = BenchConfig(
        model="demo-small",
        strategies=("torchrec", "embark"),
        allow=("fp16", "bf16"),
        pipeline=False,
        profile=True,
        steps=3,
    )
    job = RankJob(
        config=config, strategy="embark", label="embark", position="2/3", out_dir=tmp_path
    )
    assert RankJob.from_json(job.to_json()) == job
    assert job.name == "embark" and job.tower_module == "identity" and job.tower_ratio is None
    with pytest.raises(ConfigError, match="'embark-towers' is not among the bench's strategies"):
        RankJob(config=config, strategy="embark-towers", out_dir=tmp_path)
    with pytest.raises(SystemExit, match=r"JOB\.json"):
        worker.main(["--strategy", "embark"])


def test_bench_config_checks_embark_options(tmp_path: Path) -> None:
    from lightning_embark.plan import Compression

    config = BenchConfig(
        model="demo-small", strategies=("torchrec", "embark"), allow=("fp16", "int8")
    )
    assert _built(config, "embark", tmp_path).options.allow == (
        Compression.FP16,
        Compression.INT8,
    )
    assert _built(config, "torchrec", tmp_path).qcomms is None  # allow is embark's
    for strategy in config.strategies:  # one default for every row: fp32 unless allow has bf16
        assert _job(config, strategy, tmp_path).config.dense_format == "fp32", strategy
        assert _dense(_built(config, strategy, tmp_path)) == "fp32", strategy
    with_bf16 = BenchConfig(model="demo-small", strategies=("torchrec", "embark"), allow=("bf16",))
    for strategy in with_bf16.strategies:
        assert _dense(_built(with_bf16, strategy, tmp_path)) == "bf16", strategy
    chosen = BenchConfig(model="demo-small", strategies=("embark",), dense_compression="fp16")
    assert _dense(_built(chosen, "embark", tmp_path)) == "fp16"
    with pytest.raises(ConfigError, match="none of which is in strategies"):
        BenchConfig(model="demo-small", strategies=("torchrec",), allow=("fp16",))
    with pytest.raises(ConfigError, match="unknown compressions \\['fp4'\\]"):
        BenchConfig(model="demo-small", strategies=("embark",), allow=("fp4",))
    rule_based_plan(load_spec("demo-small"), (1, 2)).save(tmp_path / "p.json")
    with pytest.raises(ConfigError, match="is for 2 ranks but the cluster has 4"):
        BenchConfig(model="demo-small", strategies=("embark",), plan=str(tmp_path / "p.json"))
    with pytest.raises(ConfigError, match="cannot read plan"):
        BenchConfig(
            model="demo-small", strategies=("embark",), plan=str(tmp_path / "missing.json")
        )
    assert main(["--model", "demo-small", "--strategies", "torchrec", "--allow", "fp16"]) == 2


def _worker_config(strategy: str, **kwargs: Any) -> BenchConfig:
    """A bench of one strategy: demo-small, 8 samples, one step."""
    return BenchConfig(model="demo-small", strategies=(strategy,), batch_size=8, steps=1, **kwargs)


def test_worker_builds_embark_with_allowed_compressions(tmp_path: Path) -> None:
    from lightning_embark.plan._types import Compression
    from lightning_embark.strategies import EmbarkStrategy

    strategy = _built(_worker_config("embark", allow=("fp16", "int8")), "embark", tmp_path)
    assert isinstance(strategy, EmbarkStrategy) and strategy.plan is None
    assert strategy.options.allow == (Compression.FP16, Compression.INT8)
    assert strategy.options.engine.pipeline and strategy.options.engine.overlap
    from lightning_embark.strategies._torchrec import TorchrecStrategy

    baseline = _built(_worker_config("torchrec-fp16"), "torchrec-fp16", tmp_path)
    assert (
        isinstance(baseline, TorchrecStrategy)
        and baseline.qcomms == "fp16"
        and baseline.batch_size == 8
    )
    theirs = _built(
        _worker_config("embark-torchrec-plan", dense_compression="fp32"),
        "embark-torchrec-plan",
        tmp_path,
    )
    assert isinstance(theirs, EmbarkStrategy) and theirs.options.planner == "torchrec"
    assert theirs.dense_compression == Compression.FP32
    plain = _built(_worker_config("embark", pipeline=False, overlap=False), "embark", tmp_path)
    assert not plain.options.engine.pipeline and not plain.options.engine.overlap


def test_bench_config_runs_embark_towers_once_per_tower_module(tmp_path: Path) -> None:
    config = BenchConfig(
        model="demo-small",
        strategies=("embark", "embark-towers"),
        tower_modules=("identity", "projection"),
        tower_ratio=4.0,
        allow=("fp16",),
    )
    assert config.runs() == [
        ("embark", "embark"),
        ("embark-towers:identity", "embark-towers"),
        ("embark-towers:projection", "embark-towers"),
    ]
    identity = _job(config, "embark-towers", tmp_path, "embark-towers:identity")
    projection = _job(config, "embark-towers", tmp_path, "embark-towers:projection")
    assert identity.tower_module == "identity" and identity.tower_ratio is None
    assert (projection.tower_module, projection.tower_ratio) == ("projection", 4.0)
    assert BenchConfig(model="demo-small", strategies=("embark-towers",), allow=("fp16",))
    with pytest.raises(ConfigError, match=r"\['dcn'\] need tower_ratio"):
        BenchConfig(model="demo-small", strategies=("embark-towers",), tower_modules=("dcn",))
    with pytest.raises(ConfigError, match="tower modules \\['mlp'\\]: choose from"):
        BenchConfig(model="demo-small", strategies=("embark-towers",), tower_modules=("mlp",))
    with pytest.raises(ConfigError, match="towers='three'"):
        BenchConfig(model="demo-small", strategies=("embark-towers",), towers="three")
    (tmp_path / "towers.json").write_text('{"towers": []}')
    from_file = BenchConfig(
        model="demo-small", strategies=("embark-towers",), towers=str(tmp_path / "towers.json")
    )
    assert from_file.runs() == [("embark-towers", "embark-towers")]
    job = _job(from_file, "embark-towers", tmp_path, "embark-towers")
    assert job.config.towers == str((tmp_path / "towers.json").resolve())
    assert job.tower_module == "identity"
    with pytest.raises(ConfigError, match="says each tower's module and width"):
        BenchConfig(
            model="demo-small",
            strategies=("embark-towers",),
            towers=str(tmp_path / "towers.json"),
            tower_ratio=2.0,
        )


def test_bench_config_runs_torchrec_towers_once_per_compressing_module(tmp_path: Path) -> None:
    """torchrec's tower sharding cannot wrap an identity tower (DDP refuses a module without
    parameters): ``torchrec-towers`` runs the compressing modules only, and is refused
    when none is given; it is ``torchrec`` over the towered model."""
    from lightning_embark.plan import TowerRequest, save_towers
    from lightning_embark.strategies import TorchrecStrategy

    config = BenchConfig(
        model="demo-small",
        strategies=("embark-towers", "torchrec-towers"),
        tower_modules=("identity", "projection"),
        tower_ratio=4.0,
        tower_compression="fp16",
    )
    assert config.runs() == [
        ("embark-towers:identity", "embark-towers"),
        ("embark-towers:projection", "embark-towers"),
        ("torchrec-towers:projection", "torchrec-towers"),
    ]
    job = _job(config, "torchrec-towers", tmp_path, "torchrec-towers:projection")
    assert (job.tower_module, job.tower_ratio) == ("projection", 4.0)
    strategy = _built(config, "torchrec-towers", tmp_path, "torchrec-towers:projection")
    assert isinstance(strategy, TorchrecStrategy) and strategy.qcomms is None  # fp32 outputs
    with pytest.raises(ConfigError, match=r"cannot run identity towers .* identity only"):
        BenchConfig(model="demo-small", strategies=("torchrec-towers",))
    save_towers([TowerRequest(name="t", tables=("f0",))], tmp_path / "towers.json")
    with pytest.raises(ConfigError, match=r"has identity towers \['t'\]"):
        BenchConfig(
            model="demo-small",
            strategies=("torchrec-towers",),
            towers=str(tmp_path / "towers.json"),
        )


@pytest.mark.multiprocess
def test_bench_towers_split_their_bytes_and_a_projection_quarters_the_outputs(
    tmp_path: Path,
) -> None:
    """Identity and projection towers (ratio 4) over the same batches: the ID exchange
    is the same bytes, the output exchange (forward outputs and backward gradients,
    fp32 both) exactly a quarter (the partitioner puts demo-small's 8 tables of width 32
    in 2 towers of 4: 128 columns identity, ``32 * round(4 / 4) = 32`` projected; every
    output byte crosses hosts on this 2 x 1 cluster), and neither is counted as dense."""
    out = tmp_path / "r.json"
    code = main(
        [
            *_TINY,
            "--strategies",
            "embark-towers",
            "--tower-module",
            "identity,projection",
            "--tower-ratio",
            "4",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    runs = {run["strategy"]: run["bytes_per_step"] for run in json.loads(out.read_text())["runs"]}
    identity, projection = runs["embark-towers:identity"], runs["embark-towers:projection"]
    for per_step in (identity, projection):
        traffic = per_step["by_traffic"]
        assert traffic["towers:ids"]["inter_host"] > 0
        assert per_step["embedding_inter_host"] == (
            per_step["inter_host"]
            - traffic["dense"]["inter_host"]
            - traffic["metrics"]["inter_host"]
        )
    ids = [r["by_traffic"]["towers:ids"]["inter_host"] for r in (identity, projection)]
    assert ids[0] == ids[1]
    outputs = [r["by_traffic"]["towers:outputs"]["inter_host"] for r in (identity, projection)]
    assert outputs[0] == 4 * outputs[1] > 0


def test_dense_compression_goes_to_every_strategy(tmp_path: Path) -> None:
    """``--dense-compression`` is the dense exchange of every run, the torchrec ones too;
    without it every run gets the same default (fp32 here: ``allow`` names no bf16)."""
    config = BenchConfig(
        model="demo-small",
        strategies=("torchrec", "torchrec-twrw", "embark"),
        dense_compression="bf16",
    )
    for strategy in config.strategies:
        assert _dense(_built(config, strategy, tmp_path)) == "bf16", strategy
    default = BenchConfig(model="demo-small", strategies=("torchrec",))
    assert _built(default, "torchrec", tmp_path).dense_compression == "fp32"
    with pytest.raises(ConfigError, match="dense_compression='int8'"):
        BenchConfig(model="demo-small", strategies=("torchrec",), dense_compression="int8")


def test_worker_builds_torchrec_with_the_dense_compression(tmp_path: Path) -> None:
    from lightning_embark.strategies import TorchrecStrategy

    config = _worker_config("torchrec-twrw", dense_compression="fp16")
    twrw = _built(config, "torchrec-twrw", tmp_path)
    assert isinstance(twrw, TorchrecStrategy) and twrw.dense_compression == "fp16"
    assert twrw.sharding_types == ("table_row_wise",) and twrw.batch_size == 8
    assert twrw.pipeline
    plain = _built(_worker_config("torchrec", pipeline=False), "torchrec", tmp_path)
    assert plain.dense_compression == "fp32" and plain.sharding_types is None
    assert not plain.pipeline


def test_the_recorded_link_rate_is_the_applied_one() -> None:
    """A shaped link always has a rate: ``--rate-mbit``'s or the emulation's default; only
    loopback has none, and says why."""
    from lightning_embark.emulation import DEFAULT_RATE_MBIT
    from lightning_embark.harness._runner import applied_rate

    default = BenchConfig(model="demo-small")
    assert applied_rate(default, "netns", DEFAULT_RATE_MBIT) == (DEFAULT_RATE_MBIT, "default")
    given = BenchConfig(model="demo-small", rate_mbit=400)
    assert applied_rate(given, "netns", 400) == (400.0, "--rate-mbit")
    rate, source = applied_rate(BenchConfig(model="demo-small", loopback=True), "loopback", 800)
    assert rate is None and "--loopback" in source and "no shaped link" in source
    rate, source = applied_rate(default, "loopback", DEFAULT_RATE_MBIT)
    assert rate is None and "namespaces could not be created" in source


def test_machine_info_names_the_cpu_and_versions() -> None:
    import torch

    from lightning_embark.harness._runner import machine_info

    machine = machine_info()
    assert machine["cpu_count"] == os.cpu_count() and 1 <= machine["cpus_usable"] <= os.cpu_count()
    assert machine["torch"] == torch.__version__
    if Path("/proc/cpuinfo").is_file() and "model name" in Path("/proc/cpuinfo").read_text():
        assert machine["cpu_model"] and machine["cpu_model"] in Path("/proc/cpuinfo").read_text()


def test_progress_lines_one_per_redraw_and_in_place_on_a_terminal() -> None:
    """Rank 0's bar writes a tagged line per redraw (the launcher relays lines); on a
    terminal the bench draws each over the last and ends the bar before any other line."""
    from lightning_embark.harness._progress import PROGRESS_TAG, InPlaceProgress, StepProgress

    lines = io.StringIO()
    bar = StepProgress(title="torchrec-twrw (2/3)", total=3, warmup=1, stream=lines, mininterval=0)
    bar.on_train_start(None, None)  # type: ignore[arg-type]
    for _ in range(3):
        bar.on_train_batch_end(None)  # type: ignore[arg-type]
    bar.on_train_end(None, None)  # type: ignore[arg-type]
    drawn = lines.getvalue().splitlines()
    assert len(drawn) == 4 and all(
        line.startswith(f"{PROGRESS_TAG} torchrec-twrw (2/3):") for line in drawn
    )
    assert "0/3" in drawn[0] and "warm-up" in drawn[0]
    assert "3/3" in drawn[-1] and "measured" in drawn[-1]

    terminal = io.StringIO()
    relay = InPlaceProgress(terminal)
    relay.write(f"[host 0] {drawn[0]}\n")
    relay.write(f"[host 0] {drawn[1]}\n")
    relay.write("[host 1] a warning\n")
    relay.write(f"[host 0] {drawn[-1]}\n")
    relay.end_line()
    assert terminal.getvalue() == (
        f"\r[host 0] {drawn[0]}\x1b[K\r[host 0] {drawn[1]}\x1b[K\n[host 1] a warning\n"
        f"\r[host 0] {drawn[-1]}\x1b[K\n"
    )


@pytest.mark.multiprocess
@pytest.mark.netns
@pytest.mark.skipif(os.geteuid() != 0, reason="the shaped and unshaped links need namespaces")
def test_exposed_runs_each_strategy_on_the_shaped_link_and_again_unshaped(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """``--exposed``: every strategy runs twice on the same hosts, shaped then unshaped or the
    other way round; its exposed communication is the difference of the two median steps
    and its share that over the shaped step (arithmetic on the recorded medians, exact)."""
    out = tmp_path / "r.json"
    argv = [*_TINY, "--strategies", "torchrec,embark", "--exposed", "--rate-mbit", "100"]
    assert main([*argv, "--out", str(out)]) == 0
    printed = capsys.readouterr()
    assert "exposed ms" in printed.out
    assert printed.err.count("(shaped)") == 2 and printed.err.count("(unshaped)") == 2
    runs = json.loads(out.read_text())["runs"]
    assert [run["strategy"] for run in runs] == ["torchrec", "embark"]
    for run in runs:
        shaped = run["step_time_ms"]["median"]
        unshaped = run["unshaped"]["step_time_ms"]["median"]
        assert run["link"] == "shaped" and unshaped > 0
        assert run["exposed_ms"] == shaped - unshaped
        assert run["exposed_share"] == (shaped - unshaped) / shaped
    with pytest.raises(ConfigError, match="exposed runs every strategy"):
        BenchConfig(model="demo-small", exposed=True, loopback=True)
