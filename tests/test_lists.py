"""One rule for lists as users type them (``a,b`` or ``[a, b]``), and every command keeps it:
the rule itself, its argparse and jsonargparse forms, and each command's list options."""

from __future__ import annotations

import argparse
import re
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from jsonargparse import ArgumentParser

from lightning_embark.errors import ConfigError
from lightning_embark.lists import comma_lists, list_items, list_option, parse_list

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("text", "items"),
    [
        ("fp16,bf16", ["fp16", "bf16"]),
        (" fp16 , bf16 ,", ["fp16", "bf16"]),  # blanks and a trailing comma dropped
        ("[fp16, bf16]", ["fp16", "bf16"]),
        ("['fp16', \"bf16\"]", ["fp16", "bf16"]),
        ("fp16", ["fp16"]),
        ("", []),
        ("[]", []),
        ("a,,b", ["a", "b"]),
    ],
)
def test_split_list(text: str, items: list[str]) -> None:
    assert list_items(text) == items


def test_parse_list_types_each_item_and_names_a_bad_one() -> None:
    assert parse_list("512, 256", int, what="--dense-arch") == (512, 256)
    assert parse_list("[1, 2]", int, what="--worlds") == (1, 2)
    assert parse_list((3, 4), int, what="--worlds") == (3, 4)  # a config's list, as it is
    with pytest.raises(ConfigError, match=r"--dense-arch '512,abc': item 'abc' is not an integer"):
        parse_list("512,abc", int, what="--dense-arch")


def test_list_option_is_the_rule_for_argparse() -> None:
    parser = argparse.ArgumentParser(prog="tool", exit_on_error=False)
    parser.add_argument("--hosts", type=list_option(int), default="8,16")
    assert parser.parse_args([]).hosts == (8, 16)  # the default string goes through it
    assert parser.parse_args(["--hosts", "[1, 2]"]).hosts == (1, 2)
    with pytest.raises(argparse.ArgumentError, match=r"--hosts.*item 'x' is not an integer"):
        parser.parse_args(["--hosts", "1,x"])


def _jsonargparse() -> ArgumentParser:
    parser = ArgumentParser(exit_on_error=False)
    sub = ArgumentParser(exit_on_error=False)
    sub.add_argument("--dense", type=Sequence[int | str], default=())
    sub.add_argument("--sizes", type=tuple[int, ...] | None, default=None)
    sub.add_argument("--devices", type=list[int] | str | int, default="auto")
    sub.add_argument("--name", type=str, default="x")
    commands = parser.add_subcommands()
    commands.add_subcommand("fit", sub)
    return parser


def test_comma_lists_rewrites_the_list_options_of_a_jsonargparse_parser() -> None:
    """A list of plain values takes ``a,b`` as ``[a, b]``, with or without ``=``; an option
    that takes a string too, a plain string option, a bracketed value and ``null`` are
    left as typed; the items then read as inside brackets (``1`` an int)."""
    parser = _jsonargparse()
    args = comma_lists(
        parser,
        ["fit", "--dense", "price, 1", "--sizes=32,16", "--devices", "0,1", "--name", "a,b"],
    )
    assert args == [
        *("fit", "--dense", "[price, 1]", "--sizes=[32, 16]"),
        *("--devices", "0,1", "--name", "a,b"),
    ]
    fit = parser.parse_args(args).fit
    assert (list(fit.dense), fit.sizes, fit.devices, fit.name) == (
        ["price", 1],
        (32, 16),
        "0,1",
        "a,b",
    )
    assert comma_lists(parser, ["fit", "--dense", "[a]", "--sizes", "null"]) == [
        *("fit", "--dense", "[a]", "--sizes", "null"),
    ]
    quoted = comma_lists(parser, ["fit", "--dense", "a: b,c"])  # YAML would read a mapping
    assert parser.parse_args(quoted).fit.dense == ["a: b", "c"]


def _bench_config(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> Any:
    from lightning_embark.cli import embark_bench

    seen: list[Any] = []

    def capture(config: Any) -> Any:
        seen.append(config)
        raise SystemExit(0)

    monkeypatch.setattr(embark_bench, "run_benchmark", capture)
    with pytest.raises(SystemExit):
        embark_bench.main(["--model", "demo-small", *argv])
    return seen[0]


def test_every_command_takes_comma_and_bracket_lists_alike(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each command's list options, typed both ways, give the same values."""
    from lightning_embark.calibration._worker import parse_sizes
    from lightning_embark.cli import embark_plan, embark_towers, embark_tune
    from lightning_embark.harness._training import _sizes

    def bench_args(strategies: str, allow: str, modules: str) -> list[str]:
        return [
            *("--strategies", strategies, "--allow", allow),
            *("--tower-module", modules, "--tower-ratio", "4"),
        ]

    forms = [
        bench_args("torchrec,embark", "fp16,bf16", "identity,dcn"),
        bench_args("[torchrec, embark]", "[fp16, bf16]", "[identity, dcn]"),
    ]
    bench = [_bench_config(f, monkeypatch) for f in forms]
    assert {(b.strategies, b.allow, b.tower_modules) for b in bench} == {
        (("torchrec", "embark"), ("fp16", "bf16"), ("identity", "dcn"))
    }
    tune = [
        embark_tune.config_from_args(embark_tune.build_parser().parse_args(["--model", "m", *f]))
        for f in (["--allow", "fp16, bf16"], ["--allow", "[fp16, bf16]"])
    ]
    assert tune[0].allow == tune[1].allow == ("fp16", "bf16")
    assert embark_plan._allow("fp16,int8") == embark_plan._allow("[fp16, int8]")
    assert embark_plan._compare("torchrec,flat") == embark_plan._compare("[torchrec, flat]")
    assert embark_towers._sizes("--over-arch", "64,32,1") == [64, 32, 1]
    assert embark_towers._sizes("--over-arch", "[64, 32, 1]") == [64, 32, 1]
    assert _sizes("512,256") == _sizes("[512, 256]") == [512, 256]  # bench and tune ranks
    assert parse_sizes("4K,1M") == parse_sizes("[4K, 1M]") == [4096, 1 << 20]


def test_the_gpu_check_takes_comma_and_bracket_worlds(monkeypatch: pytest.MonkeyPatch) -> None:
    from lightning_embark.gpucheck import __main__ as gpucheck

    seen: list[Any] = []

    def capture(config: Any) -> Any:
        seen.append(config.worlds)
        raise SystemExit(0)

    monkeypatch.setattr(gpucheck, "run_check", capture)
    for worlds in ("1,2", "[1, 2]"):
        with pytest.raises(SystemExit):
            gpucheck.main(["--device", "cpu", "--worlds", worlds])
    assert seen == [(1, 2), (1, 2)]


def test_no_code_splits_a_list_by_itself() -> None:
    """Every list a user types goes through :mod:`lightning_embark.lists`: a ``.split(",")``
    elsewhere is a second rule (the backend string torch reports is not a user's list)."""
    names = subprocess.run(
        ["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    allowed = {
        "lightning_embark/lists.py",
        "lightning_embark/calibration/_probes.py",  # torch's "cpu:gloo,cuda:nccl"
    }
    splitting = re.compile(r"\.split\(\s*[\"'],[\"']\s*\)")
    offenders = [
        name
        for name in names
        if not name.startswith("tests/")
        and name not in allowed
        and splitting.search((ROOT / name).read_text())
    ]
    assert not offenders, offenders
