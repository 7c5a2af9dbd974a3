"""`dapo-async report RUN_DIR`: PNG plots of a run from its metrics files, for people who cannot
open the Aim UI.

Reads ``<run_dir>/metrics/*.jsonl`` (learner, buffer, every generator) and writes into
``<run_dir>/report/`` (or ``--out``):

    reward_accuracy.png   rollout reward and accuracy per step, held-out accuracy
    response_length.png   mean/max response length, fraction truncated
    staleness.png         mean/max staleness of trained tokens
    throughput.png        learner samples/s, generator tokens/s
    idle.png              learner and generator idle ratios

A plot whose metrics are absent is skipped with a note. Works on a finished or a running run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# Plots: file name → (title, [(role prefix, metric, label)], y-axis label). Plots of learner
# metrics use the learner step as x; plots mixing roles use seconds since the run's first record
# (each role counts its own ``step`` differently).
MIXED_ROLES = ("throughput.png", "idle.png")
PLOTS: dict[str, tuple[str, list[tuple[str, str, str]], str]] = {
    "reward_accuracy.png": (
        "Reward and accuracy",
        [
            ("learner", "rollout/sampled_accuracy", "accuracy of all sampled responses"),
            ("learner", "rollout/trained_accuracy", "accuracy of trained groups (after filter)"),
            ("learner", "rollout/reward_mean", "reward of trained groups"),
            ("learner", "eval/accuracy", "held-out accuracy"),
        ],
        "value",
    ),
    "response_length.png": (
        "Response length",
        [
            ("learner", "rollout/response_len_mean", "mean length"),
            ("learner", "rollout/response_len_max", "max length"),
        ],
        "tokens",
    ),
    "staleness.png": (
        "Staleness of trained tokens",
        [
            ("learner", "staleness/mean", "mean"),
            ("learner", "staleness/max", "max"),
        ],
        "versions behind",
    ),
    "throughput.png": (
        "Throughput",
        [
            ("learner", "learner/samples_per_s", "learner samples/s"),
            ("gen", "generator/tokens_per_s", "generator tokens/s"),
        ],
        "per second",
    ),
    "idle.png": (
        "Idle ratios",
        [
            ("learner", "learner/idle_ratio", "learner"),
            ("gen", "generator/idle_ratio", "generator"),
        ],
        "fraction of time",
    ),
}


def load_series(metrics_dir: Path) -> dict[str, list[dict]]:
    """{role: records} for every metrics file (lines cut by a crash are skipped)."""
    out: dict[str, list[dict]] = {}
    for f in sorted(metrics_dir.glob("*.jsonl")):
        recs = []
        for line in f.read_text().splitlines():
            try:
                recs.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        out[f.stem] = recs
    return out


def _xy(records: list[dict], metric: str, t0: float | None) -> tuple[list[float], list[float]]:
    """(x, y) of ``metric``: x is the step, or seconds since ``t0`` when given."""
    key = "step" if t0 is None else "time"
    pts = [(r[key], r[metric]) for r in records if metric in r and key in r]
    off = t0 or 0.0
    return [p[0] - off for p in pts], [p[1] for p in pts]


def write_report(run_dir: Path, out_dir: Path) -> tuple[list[Path], list[str]]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics_dir = run_dir / "metrics"
    if not metrics_dir.is_dir():
        raise FileNotFoundError(f"{metrics_dir} does not exist (is {run_dir} a run directory?)")
    series = load_series(metrics_dir)
    times = [r["time"] for recs in series.values() for r in recs if "time" in r]
    start = min(times) if times else 0.0
    out_dir.mkdir(parents=True, exist_ok=True)
    written, skipped = [], []
    for name, (title, lines, ylabel) in PLOTS.items():
        fig, ax = plt.subplots(figsize=(7, 4))
        drawn = 0
        for prefix, metric, label in lines:
            for role, recs in series.items():
                if not role.startswith(prefix):
                    continue
                x, y = _xy(recs, metric, start if name in MIXED_ROLES else None)
                if not x:
                    continue
                tag = label if role == prefix else f"{label} ({role})"
                ax.plot(x, y, marker="o" if len(x) < 30 else None, markersize=3, label=tag)
                drawn += 1
        if not drawn:
            plt.close(fig)
            skipped.append(name)
            continue
        ax.set_title(f"{title} — {run_dir.name}")
        ax.set_xlabel("seconds since start" if name in MIXED_ROLES else "learner step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = out_dir / name
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written, skipped


def main(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    out_dir = Path(args.out) if args.out else run_dir / "report"
    try:
        written, skipped = write_report(run_dir, out_dir)
    except FileNotFoundError as e:
        print(f"dapo-async report: error: {e}", file=sys.stderr)
        return 1
    for p in written:
        print(f"wrote {p}", file=sys.stderr)
    for name in skipped:
        print(f"skipped {name}: no data for it in {run_dir / 'metrics'}", file=sys.stderr)
    if not written:
        print("dapo-async report: error: no metrics to plot", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"files": [str(p) for p in written], "skipped": skipped}))
    return 0
