"""Docs kept true: the README's command table names every `dapo-async` subcommand and bench,
and every bench command the docs show parses."""

import re
import shlex
from pathlib import Path

import pytest

from dapo_async.bench.options import BENCHES
from dapo_async.cli import build_parser

REPO = Path(__file__).resolve().parents[1]


def test_readme_command_table_lists_every_subcommand():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    readme = (REPO / "README.md").read_text()
    listed = set(re.findall(r"`dapo-async ([a-z-]+)", readme))
    listed |= {
        n for group in re.findall(r"`dapo-async ([a-z/-]+) ", readme) for n in group.split("/")
    }
    missing = sorted(set(sub.choices) - listed)
    assert not missing, f"README's command table lacks: {missing}"


def _documented_bench_commands() -> list[str]:
    """Every `dapo-async bench …` in the README and docs/, optional parts taken as written
    (``[--fresh]`` → ``--fresh``, ``[--ladder paper\\|async]`` → ``--ladder paper``)."""
    commands = []
    for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for span in re.findall(r"`(dapo-async bench [^`]*)`", path.read_text()):
            cmd = " ".join(span.split()).replace("[k=v]", "").replace("\\|", "|")
            cmd = re.sub(r"\[([^\]]*)\]", lambda m: m.group(1).split("|")[0], cmd)
            if not cmd.split()[2].isupper():  # `bench WHAT --help` names no bench
                commands.append((path.name, cmd))
    return commands


def test_every_documented_bench_command_parses():
    """Each bench takes only its own options, so a doc that names an option the bench lacks
    (or a bench that is gone) fails here rather than on a reader's machine."""
    parser = build_parser()
    commands = _documented_bench_commands()
    assert len({cmd.split()[2] for _, cmd in commands}) >= 11, commands
    for where, cmd in commands:
        try:
            parser.parse_args(shlex.split(cmd)[1:])
        except SystemExit:
            pytest.fail(f"{where}: `{cmd}` does not parse")


def test_readme_lists_every_bench():
    readme = (REPO / "README.md").read_text()
    missing = [name for name in BENCHES if f"`dapo-async bench {name}" not in readme]
    assert not missing, f"README's bench table lacks: {missing}"


def _doc_sources() -> list[Path]:
    return [
        REPO / "README.md",
        *sorted((REPO / "docs").glob("*.md")),
        *sorted((REPO / "configs").glob("*.yaml")),
    ]


def test_every_doc_reference_names_a_file_in_the_repository():
    """`docs/x.md` (or a `configs/`, `tools/`, `dapo_async/` path) cited in the README, the docs
    or a shipped config exists; no doc points outside the repository (``../``)."""
    missing, outside = [], []
    for path in _doc_sources():
        text = path.read_text()
        for ref in re.findall(r"\b((?:docs|configs|tools)/[\w./-]+\.(?:md|yaml|sh|sbatch))", text):
            if not (REPO / ref).exists():
                missing.append(f"{path.name}: {ref}")
        outside += [f"{path.name}: {m}" for m in re.findall(r"\.\./[\w./-]+", text)]
    assert not missing, missing
    assert not outside, outside


def test_a_cited_section_exists():
    """``(docs/x.md, Section)`` and ``docs/x.md's "Section"``: the file has that heading."""
    bad = []
    for path in _doc_sources():
        for doc, section in re.findall(r"(docs/[\w-]+\.md), ([A-Z][\w -]+)\)", path.read_text()):
            headings = re.findall(r"^#+ (.+)$", (REPO / doc).read_text(), flags=re.M)
            if not any(h.startswith(section.strip()) for h in headings):
                bad.append(f"{path.name}: {doc}, {section}")
    assert not bad, bad


def test_help_defaults_say_what_the_code_does():
    """`tune --out` and `dashboard --repo`: what their help calls the default is what runs."""
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    tune = {a.dest: a.help for a in sub.choices["tune"]._actions}
    assert "runs/tune-" in tune["out"]
    assert 'Path("runs") / f"tune-' in (REPO / "dapo_async" / "bench" / "tune.py").read_text()
    dash = {a.dest: a.help for a in sub.choices["dashboard"]._actions}
    assert "runs/aim" in dash["repo"]


def test_architecture_quotes_no_bench_figure_results_lacks():
    """Measured figures live in docs/results.md with their command; the architecture refers
    to them instead of quoting numbers of its own next to a bench."""
    text = (REPO / "docs" / "architecture.md").read_text()
    quoted = re.findall(r"`dapo-async bench \w+[^`]*` measured\s+[\d.]+", text)
    assert not quoted, quoted


def test_architecture_names_files_that_exist_in_the_folders_it_says():
    """Every `folder/` row of docs/architecture.md's package tables names files of that folder
    that exist, and names every module of the role and engine folders."""
    import re

    text = (REPO / "docs" / "architecture.md").read_text()
    tables = text[text.index("## Packages") : text.index("## The path of one group")]
    pkg = REPO / "dapo_async"
    missing, unnamed = [], []
    for row in tables.splitlines():
        m = re.match(r"\| [^|]+ \| `(\w+)/(\w*\.py)?`?", row)
        if not m:
            continue
        folder = m.group(1)
        for name in re.findall(r"`(\w+\.py)`", row):
            if not (pkg / folder / name).exists() and not (pkg / name).exists():
                missing.append(f"{folder}/{name}")
        if folder in ("buffer", "generator", "launch", "engines", "weight_sync", "learner"):
            named = set(re.findall(r"`(\w+\.py)`", row))
            unnamed += [
                f"{folder}/{p.name}"
                for p in (pkg / folder).glob("*.py")
                if p.name != "__init__.py" and p.name not in named
            ]
    assert not missing, missing
    assert not unnamed, unnamed
