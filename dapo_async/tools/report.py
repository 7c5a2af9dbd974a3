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
from dataclasses import dataclass
from pathlib import Path

from dapo_async.tools.inspect_cmd import examples_page
from dapo_async.tools.report_dists import write_distributions


@dataclass(frozen=True)
class Figure:
    """One PNG: panels by y label, each {series: legend label}; a series is a metric of the
    learner's records (``train/loss``) or ``role:metric`` (``gen:generator/tokens_per_s``: every
    metrics file whose role starts with ``gen``); x is ``step`` or ``time``."""

    title: str
    panels: dict[str, dict[str, str]]
    x: str = "step"


ACC = {"rollout/sampled_accuracy": "accuracy of all sampled responses"}
HELDOUT = {
    "eval/accuracy": "held-out accuracy",
    "evaluator:eval/accuracy": "held-out accuracy (evaluator)",
}
REWARD = {"rollout/reward_mean": "reward of trained groups"}
PLOTS: dict[str, Figure] = {
    "summary.png": Figure(
        "Summary",
        {
            "accuracy": {**ACC, **HELDOUT},
            "learner samples/s": {"learner/samples_per_s": "samples/s"},
            "reward": REWARD,
            "learner idle ratio": {"learner/idle_ratio": "idle"},
        },
    ),
    "reward_accuracy.png": Figure(
        "Reward and accuracy",
        {
            "accuracy": {
                **ACC,
                "rollout/trained_accuracy": "accuracy of trained groups",
                **HELDOUT,
            },
            "reward": REWARD,
        },
    ),
    "response_length.png": Figure(
        "Response length",
        {
            "tokens": {"rollout/response_len_mean": "mean", "rollout/response_len_max": "max"},
            "fraction truncated": {"rollout/clip_ratio": "truncated"},
        },
    ),
    "staleness.png": Figure(
        "Staleness of trained tokens",
        {"versions behind": {"staleness/mean": "mean", "staleness/max": "max"}},
    ),
    "training.png": Figure(
        "Training dynamics",
        {
            "loss": {"train/loss": "loss"},
            "entropy (nats)": {"train/entropy": "entropy"},
            "KL to π_prox": {"train/approx_kl_prox": "approx KL"},
            "grad norm": {"train/grad_norm": "grad norm"},
            "clip fraction": {
                "train/pg_clip_frac_low": "clipped low",
                "train/pg_clip_frac_high": "clipped high",
                "train/dual_clip_frac": "dual clip",
            },
            "importance weight": {
                "train/is_weight_mean": "mean",
                "train/is_weight_max": "max",
                "train/ratio_mean": "π/π_prox mean",
            },
        },
    ),
    "throughput.png": Figure(
        "Throughput",
        {
            "learner samples/s": {"learner/samples_per_s": "learner"},
            "generator tokens/s": {"gen:generator/tokens_per_s": "generator"},
        },
        x="time",
    ),
    "idle.png": Figure(
        "Idle ratios",
        {
            "fraction of time": {
                "learner/idle_ratio": "learner",
                "gen:generator/idle_ratio": "generator",
            }
        },
        x="time",
    ),
    "resources.png": Figure(
        "Resources per role (resources/*)",
        {
            role_panel: {
                f"{role}:resources/{key}": name
                for role, name in (
                    ("learner", "learner"),
                    ("buffer", "buffer"),
                    ("gen", "generator"),
                )
            }
            for role_panel, key in (
                ("CPU % (100 = one core)", "cpu_percent"),
                ("resident memory (MiB)", "rss_mb"),
                ("GPU memory allocated (MiB)", "gpu_allocated_mb"),
                ("socket bytes sent (MiB)", "sent_mb"),
                ("weight sync (MiB)", "wsync_mb"),
            )
        },
        x="time",
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


def _draw_panel(ax, runs: dict[str, dict], lines: dict[str, str], x: str, starts: dict) -> int:
    drawn = 0
    for run_name, series in runs.items():
        for line, label in lines.items():
            prefix, _, metric = line.rpartition(":")
            prefix = prefix or "learner"
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


def _figure(plt, figure: Figure, runs: dict, starts: dict):
    title, panels, x = figure.title, list(figure.panels.items()), figure.x
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
    for name, figure in PLOTS.items():
        fig, drawn = _figure(plt, figure, runs, starts)
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
    for run_dir in run_dirs:  # one page of recorded rollouts per run (dapo-async inspect)
        name = "examples.md" if len(run_dirs) == 1 else f"examples-{run_dir.name}.md"
        page = examples_page(run_dir)
        if page:
            (out_dir / name).write_text(page)
            written.append(out_dir / name)
        else:
            skipped.append(name)
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
