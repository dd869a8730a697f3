"""The docs keep up with the code: every CLI option is documented under its own command, the
README's option table is EmbarkStrategy's, every cited section of docs/architecture.md
exists, and nothing in the repo cites a file outside it."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import re
import subprocess
from pathlib import Path

import pytest

from lightning_embark.cli import (
    embark_bench,
    embark_calibrate,
    embark_cluster,
    embark_plan,
    embark_stats,
    embark_towers,
    embark_tune,
)
from lightning_embark.gpucheck import __main__ as gpucheck_main

ROOT = Path(__file__).resolve().parents[1]
PARSERS = {
    "embark-bench": embark_bench.build_parser,
    "embark-calibrate": embark_calibrate.build_parser,
    "embark-cluster": embark_cluster.build_parser,
    "embark-plan": embark_plan.build_parser,
    "embark-stats": embark_stats.build_parser,
    "embark-towers": embark_towers.build_parser,
    "embark-tune": embark_tune.build_parser,
    "gpucheck": gpucheck_main.build_parser,
}
#: The section of docs/cli.md of a command whose heading is not its name.
SECTIONS = {"gpucheck": "The GPU check"}


def _options(parser: argparse.ArgumentParser) -> set[str]:
    found = set()
    for action in parser._actions:
        found.update(o for o in action.option_strings if o.startswith("--"))
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found |= _options(sub)
    return found


def _sections(markdown: str) -> dict[str, str]:
    """The text under each level-1 or level-2 heading, up to the next one (``#`` lines
    inside fenced code blocks are comments, not headings)."""
    sections: dict[str, list[str]] = {}
    current: list[str] = []
    fenced = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        heading = None if fenced else re.match(r"^#{1,2} (.+)$", line)
        if heading:
            current = sections.setdefault(heading.group(1).strip(), [])
        else:
            current.append(line)
    return {title: "\n".join(lines) for title, lines in sections.items()}


def _mentions(text: str, option: str) -> bool:
    """``option`` as a whole flag: ``--out`` is not found in ``--out-dir``."""
    return re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", text) is not None


@pytest.mark.parametrize("command", sorted(PARSERS))
def test_every_option_of_every_command_is_in_its_own_section_of_the_cli_reference(
    command: str,
) -> None:
    sections = _sections((ROOT / "docs" / "cli.md").read_text())
    title = SECTIONS.get(command, command)
    assert title in sections, f"docs/cli.md has no section '## {title}'"
    missing = sorted(o for o in _options(PARSERS[command]()) if not _mentions(sections[title], o))
    assert not missing, f"{command} options missing from its section of docs/cli.md: {missing}"


def test_the_section_rule_sees_an_option_under_another_command() -> None:
    """A guard on the guard: an option documented only under another command, or only as
    the start of a longer flag, is not found; a ``#`` comment in a code block starts no
    section."""
    page = (
        "# Tools\n## a-cmd\n`--alpha`, `--out-dir`\n```bash\n# --beta\n```\n## b-cmd\n`--beta`\n"
    )
    sections = _sections(page)
    assert set(sections) == {"Tools", "a-cmd", "b-cmd"}
    assert _mentions(sections["a-cmd"], "--alpha") and _mentions(sections["a-cmd"], "--beta")
    assert not _mentions(sections["a-cmd"], "--out")
    assert not _mentions(sections["b-cmd"], "--alpha")


def _anchors(markdown: str) -> set[str]:
    """GitHub's anchors of a page's headings (lower case, punctuation dropped, spaces to -)."""
    out = set()
    for heading in re.findall(r"^#+ (.+)$", markdown, flags=re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        out.add(slug)
    return out


def _tracked(*patterns: str) -> list[Path]:
    names = subprocess.run(
        ["git", "ls-files", *patterns], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    return [ROOT / n for n in names]


def test_cited_architecture_sections_exist() -> None:
    anchors = _anchors((ROOT / "docs" / "architecture.md").read_text())
    cited = {
        (path.relative_to(ROOT), anchor)
        for path in _tracked("*.py", "*.md")
        for anchor in re.findall(r"architecture\.md#([\w-]+)", path.read_text())
    }
    assert cited, "nothing cites docs/architecture.md: this test looks in the wrong place"
    assert not [c for c in cited if c[1] not in anchors], sorted(
        c for c in cited if c[1] not in anchors
    )


def test_every_markdown_link_to_a_section_resolves() -> None:
    """``[text](page.md#section)`` and ``[text](#section)`` in the README and the docs name a
    page that exists and a heading on it (the README links into docs/ for what it leaves
    out)."""
    links = [
        (path, target, anchor)
        for path in _tracked("*.md")
        for target, anchor in re.findall(r"\]\(([^)#\s]*)#([^)\s]+)\)", path.read_text())
    ]
    assert len(links) > 20, "few section links found: this test looks in the wrong place"
    broken = [
        f"{path.relative_to(ROOT)}: {target}#{anchor}"
        for path, target, anchor in links
        if not (page := path if not target else (path.parent / target).resolve()).is_file()
        or (page.suffix == ".md" and anchor not in _anchors(page.read_text()))
    ]
    assert not broken, broken


def test_nothing_cites_a_design_file_outside_the_repo() -> None:
    """The design notes the project started from live outside the repo; what the code
    needs of them is in docs/. (The name is joined here so this file does not match.)"""
    outside = ".".join(("DESIGN", "md"))
    offenders = [
        str(path.relative_to(ROOT))
        for path in _tracked("*.py", "*.md", "*.toml", "Makefile")
        if outside in path.read_text()
    ]
    assert not offenders


def test_the_user_docs_speak_of_the_product_only() -> None:
    """Figures carry their command and date, not a work log's labels."""
    label = re.compile(r"\b[Ss]top [0-9]+\b|\bissue #?[0-9]+\b")
    offenders = [
        f"{path.relative_to(ROOT)}: {line.strip()}"
        for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
        for line in path.read_text().splitlines()
        if label.search(line)
    ]
    assert not offenders


README = ROOT / "README.md"
#: Lines a user sees before scrolling: where the README says what has run on a GPU.
FIRST_SCREEN = 25


def _section(markdown: str, heading: str) -> str:
    start = markdown.index(f"\n{heading}\n")
    end = markdown.find("\n#", start + len(heading) + 2)
    return markdown[start : None if end < 0 else end]


def test_the_readme_option_table_is_embark_strategys() -> None:
    """Every keyword of ``EmbarkStrategy`` is a row of the README's table, in order, with
    its default as the signature has it; the options dataclass holds the same names (the
    engine's options inside its ``EngineConfig``), and its defaults are the signature's
    wherever the signature does not leave the choice to ``EmbarkOptions.create`` (None).
    The engine's defaults are the engine's own: one default per option."""
    from lightning_embark.engine import EngineConfig
    from lightning_embark.sharding import EmbarkOptions
    from lightning_embark.strategies import EmbarkStrategy

    rows = re.findall(
        r"^\| `(\w+)` \| `([^`]+)` \|", _section(README.read_text(), "### Options"), re.M
    )
    assert rows, "README.md has no option table under '### Options'"
    signature = {
        name: p.default
        for name, p in inspect.signature(EmbarkStrategy.__init__).parameters.items()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    }
    assert [name for name, _ in rows] == list(signature)
    wrong = {
        name: (cell, signature[name])
        for name, cell in rows
        if ast.literal_eval(cell) != signature[name]
    }
    assert not wrong, f"README default, signature default: {wrong}"
    engine = {f.name: f.default for f in dataclasses.fields(EngineConfig)}
    fields = {f.name: f.default for f in dataclasses.fields(EmbarkOptions) if f.name != "engine"}
    assert set(fields) | set(engine) == set(signature)
    assert not set(fields) & set(engine)
    assert [n for n in signature if n in fields] == list(fields)
    assert {n: {**fields, **engine}[n] for n, d in signature.items() if d is not None} == {
        n: d for n, d in signature.items() if d is not None
    }
    assert EmbarkOptions.create().engine == EngineConfig()


def test_the_readme_is_for_users() -> None:
    """At most 250 lines; what has run on a GPU, and what to run there first, on its first
    screen; no dates or commit hashes (they belong to docs/benchmarks.md with their runs)."""
    lines = README.read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines"
    first = "\n".join(lines[:FIRST_SCREEN])
    assert "run on a GPU" in first and "python -m lightning_embark.gpucheck" in first
    date = re.compile(r"\b20\d\d-\d\d-\d\d\b")
    commit = re.compile(r"\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b")
    dated = [line for line in lines if date.search(line) or commit.search(line)]
    assert not dated, dated
