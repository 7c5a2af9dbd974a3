"""Docs kept true: the README's command table names every `dapo-async` subcommand."""

import re
from pathlib import Path

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
