"""`dapo-async report RUN_DIR [RUN_DIR ...]`: PNG plots of runs from their metrics files, for
people who cannot open the Aim UI; several runs are overlaid (each line labelled with its run).

Reads ``<run_dir>/metrics/*.jsonl`` (learner, buffer, every generator, the evaluator) and writes
into ``<run_dir>/report/`` (one run) or ``--out``:

    summary.png           the run at a glance: accuracy, held-out accuracy, samples/s, idle
    reward_accuracy.png   sampled and trained accuracy, reward; held-out accuracy as a curve
    response_length.png   mean/max response length | fraction truncated
    staleness.png         mean/max staleness of trained tokens
    training.png          loss | entropy | KL to the proximal policy | grad norm |
                          clip fractions | importance weights
    throughput.png        learner samples/s | generator tokens/s (one axis per unit)
    idle.png              idle ratio of every role over time
    distributions.png     staleness (per step and over the run) and importance-weight
                          quantiles per step (``report_dists.py``)

Each figure has one panel per unit; x is the policy version (``step``), or seconds since the
run's first record for the per-role time series (throughput, idle). A figure with no data is
skipped with a note. Works on a finished or a running run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dapo_async.tools.report_dists import write_distributions

# A line: (role prefix, metric, label); a panel: (y label, [lines]);
# a figure: file name → (title, [panels], x = "step" | "time").
Line = tuple[str, str, str]
Panel = tuple[str, list[Line]]
ACC = ("learner", "rollout/sampled_accuracy", "accuracy of all sampled responses")
HELDOUT = [
    ("learner", "eval/accuracy", "held-out accuracy"),
    ("evaluator", "eval/accuracy", "held-out accuracy (evaluator)"),
]
PLOTS: dict[str, tuple[str, list[Panel], str]] = {
    "summary.png": (
        "Summary",
        [
            ("accuracy", [ACC, *HELDOUT]),
            ("learner samples/s", [("learner", "learner/samples_per_s", "samples/s")]),
            ("reward", [("learner", "rollout/reward_mean", "reward of trained groups")]),
            ("learner idle ratio", [("learner", "learner/idle_ratio", "idle")]),
        ],
        "step",
    ),
    "reward_accuracy.png": (
        "Reward and accuracy",
        [
            (
                "accuracy",
                [
                    ACC,
                    ("learner", "rollout/trained_accuracy", "accuracy of trained groups"),
                    *HELDOUT,
                ],
            ),
            ("reward", [("learner", "rollout/reward_mean", "reward of trained groups")]),
        ],
        "step",
    ),
    "response_length.png": (
        "Response length",
        [
            (
                "tokens",
                [
                    ("learner", "rollout/response_len_mean", "mean"),
                    ("learner", "rollout/response_len_max", "max"),
                ],
            ),
            ("fraction truncated", [("learner", "rollout/clip_ratio", "truncated")]),
        ],
        "step",
    ),
    "staleness.png": (
        "Staleness of trained tokens",
        [
            (
                "versions behind",
                [("learner", "staleness/mean", "mean"), ("learner", "staleness/max", "max")],
            )
        ],
        "step",
    ),
    "training.png": (
        "Training dynamics",
        [
            ("loss", [("learner", "train/loss", "loss")]),
            ("entropy (nats)", [("learner", "train/entropy", "entropy")]),
            ("KL to π_prox", [("learner", "train/approx_kl_prox", "approx KL")]),
            ("grad norm", [("learner", "train/grad_norm", "grad norm")]),
            (
                "clip fraction",
                [
                    ("learner", "train/pg_clip_frac_low", "clipped low"),
                    ("learner", "train/pg_clip_frac_high", "clipped high"),
                    ("learner", "train/dual_clip_frac", "dual clip"),
                ],
            ),
            (
                "importance weight",
                [
                    ("learner", "train/is_weight_mean", "mean"),
                    ("learner", "train/is_weight_max", "max"),
                    ("learner", "train/ratio_mean", "π/π_prox mean"),
                ],
            ),
        ],
        "step",
    ),
    "throughput.png": (
        "Throughput",
        [
            ("learner samples/s", [("learner", "learner/samples_per_s", "learner")]),
            ("generator tokens/s", [("gen", "generator/tokens_per_s", "generator")]),
        ],
        "time",
    ),
    "idle.png": (
        "Idle ratios",
        [
            (
                "fraction of time",
                [
                    ("learner", "learner/idle_ratio", "learner"),
                    ("gen", "generator/idle_ratio", "generator"),
                ],
            )
        ],
        "time",
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


def _xy(records: list[dict], metric: str, x: str, t0: float) -> tuple[list[float], list[float]]:
    pts = [(r[x], r[metric]) for r in records if metric in r and x in r]
    off = t0 if x == "time" else 0.0
    return [p[0] - off for p in pts], [p[1] for p in pts]


def _draw_panel(ax, runs: dict[str, dict], lines: list[Line], x: str, starts: dict) -> int:
    drawn = 0
    for run_name, series in runs.items():
        for prefix, metric, label in lines:
            for role, recs in series.items():
                if not role.startswith(prefix):
                    continue
                xs, ys = _xy(recs, metric, x, starts[run_name])
                if not xs:
                    continue
                tag = label if role == prefix else f"{label} ({role})"
                if len(runs) > 1:
                    tag = f"{tag} [{run_name}]"
                ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, markersize=3, label=tag)
                drawn += 1
    return drawn


def _figure(plt, title: str, panels: list[Panel], x: str, runs: dict, starts: dict):
    cols = 2 if len(panels) > 1 else 1
    rows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(7 * cols, 3.6 * rows), squeeze=False)
    drawn = 0
    for ax, (ylabel, lines) in zip(axes.flat, panels):
        n = _draw_panel(ax, runs, lines, x, starts)
        drawn += n
        ax.set_ylabel(ylabel)
        ax.set_xlabel("seconds since start" if x == "time" else "policy version (step)")
        ax.grid(alpha=0.3)
        if n:
            ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    fig.suptitle(f"{title} — {', '.join(runs)}")
    fig.tight_layout()
    return fig, drawn


def write_report(run_dirs: list[Path], out_dir: Path) -> tuple[list[Path], list[str]]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs, starts = {}, {}
    for run_dir in run_dirs:
        metrics_dir = run_dir / "metrics"
        if not metrics_dir.is_dir():
            raise FileNotFoundError(f"{metrics_dir} does not exist (is {run_dir} a run directory?)")
        series = load_series(metrics_dir)
        runs[run_dir.name] = series
        times = [r["time"] for recs in series.values() for r in recs if "time" in r]
        starts[run_dir.name] = min(times) if times else 0.0
    out_dir.mkdir(parents=True, exist_ok=True)
    written, skipped = [], []
    for name, (title, panels, x) in PLOTS.items():
        fig, drawn = _figure(plt, title, panels, x, runs, starts)
        if not drawn:
            plt.close(fig)
            skipped.append(name)
            continue
        path = out_dir / name
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    dists = write_distributions(plt, runs, out_dir)
    if dists is None:
        skipped.append("distributions.png")
    else:
        written.append(dists)
    return written, skipped


def main(args: argparse.Namespace) -> int:
    run_dirs = [Path(d) for d in args.run_dir]
    if args.out:
        out_dir = Path(args.out)
    elif len(run_dirs) == 1:
        out_dir = run_dirs[0] / "report"
    else:
        print(
            "dapo-async report: error: several runs need --out (where the overlays go)",
            file=sys.stderr,
        )
        return 1
    try:
        written, skipped = write_report(run_dirs, out_dir)
    except FileNotFoundError as e:
        print(f"dapo-async report: error: {e}", file=sys.stderr)
        return 1
    for p in written:
        print(f"wrote {p}", file=sys.stderr)
    for name in skipped:
        print(f"skipped {name}: no data for it", file=sys.stderr)
    if not written:
        print("dapo-async report: error: no metrics to plot", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"files": [str(p) for p in written], "skipped": skipped}))
    return 0
