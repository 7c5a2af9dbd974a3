"""``dapo-async inspect RUN_DIR``: the rollouts a run recorded (``dapo_async.samples``), readable
in the terminal — the generator's groups (worst, best, truncated), what the learner trained with
its clipped tokens marked, and what the buffer dropped and why.

    dapo-async inspect RUN_DIR [--step N] [--worst|--best|--truncated|--clipped|--dropped]
                       [--n K] [--json] [--no-colour]

Token ids are shown as text with the run's own tokenizer (its config.yaml's model) where it
loads, else as ids. ``--json`` prints the selected records as one JSON list instead.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

VIEWS = ("worst", "best", "truncated", "clipped", "dropped")


def add_parser(sub) -> None:
    p = sub.add_parser("inspect", help="print a run's recorded rollouts (worst, clipped, dropped…)")
    p.add_argument("run_dir", help="the run directory (holds samples/*.jsonl)")
    p.add_argument("--step", type=int, default=None, help="only this step (default: every step)")
    views = p.add_mutually_exclusive_group()
    for view, what in zip(
        VIEWS,
        (
            "the generator's groups, lowest mean reward first",
            "the generator's groups, highest mean reward first",
            "groups with responses cut at the length limit",
            "trained responses with clipped tokens, most first",
            "groups the buffer dropped (filtered, stale, rejected) and why",
        ),
    ):
        views.add_argument(f"--{view}", dest="view", action="store_const", const=view, help=what)
    p.add_argument("--n", type=int, default=3, help="how many records (default 3)")
    p.add_argument("--json", action="store_true", help="the records as one JSON list")
    p.add_argument("--no-colour", action="store_true", help="marks as brackets, not colours")
    p.set_defaults(func=main, view="")


def select(records: list[dict], view: str, step: int | None, n: int) -> list[dict]:
    """The records ``view`` shows (module docstring), of ``step`` if given, at most ``n``."""
    if step is not None:
        records = [r for r in records if r["step"] == step]
    kind = {"clipped": "trained", "dropped": "dropped"}.get(view, "group")
    chosen = [r for r in records if r["kind"] == kind]
    if view in ("worst", "best"):
        chosen.sort(key=_mean_reward, reverse=view == "best")
    elif view == "truncated":
        chosen = [r for r in chosen if _truncated(r)]
        chosen.sort(key=_truncated, reverse=True)
    elif view == "clipped":
        chosen = [r for r in chosen if any(r["clip"])]
        chosen.sort(key=lambda r: sum(1 for c in r["clip"] if c), reverse=True)
    return chosen[:n]


def main(args: argparse.Namespace) -> int:
    from dapo_async.sample_records import render
    from dapo_async.samples import read_samples

    run_dir = Path(args.run_dir)
    records = read_samples(run_dir)
    if not records:
        print(
            f"dapo-async inspect: error: no recorded rollouts in {run_dir / 'samples'} "
            "(tracking.samples_per_step=0, or not a run directory)",
            file=sys.stderr,
        )
        return 1
    chosen = select(records, args.view, args.step, args.n)
    if args.json:
        print(json.dumps(chosen))
        return 0
    if not chosen:
        steps = sorted({r["step"] for r in records})
        print(f"nothing to show (steps recorded: {steps[0]}…{steps[-1]})", file=sys.stderr)
        return 0
    decode = _decoder(run_dir)
    colour = sys.stdout.isatty() and not args.no_colour
    print("\n\n".join(render(r, decode, colour) for r in chosen))
    return 0


def _mean_reward(r: dict) -> float:
    return sum(x["reward"] for x in r["responses"]) / max(len(r["responses"]), 1)


def _truncated(r: dict) -> int:
    return sum(1 for x in r["responses"] if x["finish"] == "length")


def _decoder(run_dir: Path):
    """The run's tokenizer's ``decode``, or None when it cannot be loaded here."""
    from dapo_async.config import load_config
    from dapo_async.sample_records import token_decoder

    try:
        return token_decoder(load_config(str(run_dir / "config.yaml"), []).model.source_dir)
    except Exception:
        return None


# What a report's examples page shows: (title, view, how many).
PAGE = (
    ("Lowest-reward groups", "worst", 2),
    ("Responses cut at the length limit", "truncated", 1),
    ("Trained responses with clipped tokens", "clipped", 2),
    ("Groups the buffer dropped", "dropped", 2),
)


def examples_page(run_dir: Path) -> str:
    """A Markdown page of a run's recorded rollouts (``dapo-async report``); empty without any."""
    from dapo_async.sample_records import render
    from dapo_async.samples import read_samples

    records = read_samples(run_dir)
    if not records:
        return ""
    decode = _decoder(run_dir)
    last = max(r["step"] for r in records)
    out = [f"# Recorded rollouts of {run_dir.name}", "", f"Steps 0–{last}; `dapo-async inspect "
           f"{run_dir}` shows more (`--step N`, `--n K`)."]  # fmt: skip
    for title, view, n in PAGE:
        chosen = select(records, view, None, n)
        out += ["", f"## {title} (`--{view}`)", ""]
        out += ["```", *(render(r, decode) + "\n" for r in chosen), "```"] if chosen else ["none"]
    return "\n".join(out) + "\n"
