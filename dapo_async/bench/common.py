"""Pieces every training bench shares: one `dapo-async train` job in a subprocess, seed lists
from the command line, and the closing lines (a human summary on stderr, then the JSON line)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def run_train(config: str, overrides: list[str], run_dir: Path, tag: str = "bench async") -> None:
    """One `dapo-async train` job in ``run_dir``; raises RuntimeError with its stderr tail."""
    cmd = [sys.executable, "-m", "dapo_async.cli", "train", config, f"run_dir={run_dir}"]
    cmd += overrides
    print(f"[{tag}] {' '.join(cmd[3:])}", file=sys.stderr, flush=True)
    res = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"training failed ({run_dir}):\n{res.stderr[-2000:]}")


def parse_seeds(text: str, flag: str = "--seeds") -> list[int]:
    try:
        seeds = [int(s) for s in text.split(",") if s.strip() != ""]
    except ValueError:
        raise SystemExit(f"bench: {flag} wants integers like 0,1,2, got {text!r}") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise SystemExit(f"bench: {flag} wants distinct integers, got {text!r}")
    return seeds


def heldout_accuracy(run_dir: Path, when: str) -> float:
    """Held-out accuracy of a finished run, ``when`` = "before" or "after" training."""
    return json.loads((Path(run_dir) / f"eval_{when}.json").read_text())["eval/accuracy"]


def print_result(summary: str, out: dict, as_json: bool) -> int:
    """The summary line on stderr; with ``--json`` the one JSON object on stdout's last line."""
    print(summary, file=sys.stderr)
    if as_json:
        print(json.dumps(out))
    return 0
