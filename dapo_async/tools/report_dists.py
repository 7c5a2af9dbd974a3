"""`distributions.png` of `dapo-async report`: how stale the trained tokens were and how far the
importance weights spread, as distributions rather than per-step means. One row per run:

    staleness over steps        stacked shares of trained tokens 0, 1, 2, … versions old
    staleness over the run      the same shares, token-weighted over all steps (a histogram)
    importance weights          p05–p95 band, median and max of π_prox/π_behav per step

Reads the learner's ``staleness/frac_<k>``, ``rollout/num_tokens`` and
``train/is_weight_p05|p50|p95|max`` records (docs/metrics.md).
"""

from __future__ import annotations

from pathlib import Path

STALE_PREFIX = "staleness/frac_"


def _levels(recs: list[dict]) -> list[int]:
    return sorted(
        {int(k[len(STALE_PREFIX) :]) for r in recs for k in r if k.startswith(STALE_PREFIX)}
    )


def _staleness_panels(ax_time, ax_hist, recs: list[dict]) -> bool:
    levels = _levels(recs)
    rows = [r for r in recs if any(f"{STALE_PREFIX}{k}" in r for k in levels)]
    if not rows:
        return False
    steps = [r["step"] for r in rows]
    shares = [[r.get(f"{STALE_PREFIX}{k}", 0.0) for r in rows] for k in levels]
    ax_time.stackplot(steps, shares, labels=[f"{k} behind" for k in levels], alpha=0.8)
    ax_time.set_ylim(0, 1)
    ax_time.set_xlabel("policy version (step)")
    ax_time.set_ylabel("share of trained tokens")
    ax_time.legend(fontsize=7, loc="lower left")
    weights = [r.get("rollout/num_tokens", 1.0) for r in rows]
    total = sum(weights) or 1.0
    run_share = [
        sum(w * s for w, s in zip(weights, level, strict=True)) / total for level in shares
    ]
    ax_hist.bar([str(k) for k in levels], run_share)
    ax_hist.set_xlabel("versions behind the trained policy")
    ax_hist.set_ylabel("share of all trained tokens")
    return True


def _weight_panel(ax, recs: list[dict]) -> bool:
    rows = [r for r in recs if "train/is_weight_p50" in r]
    if not rows:
        return False
    steps = [r["step"] for r in rows]
    ax.fill_between(
        steps,
        [r["train/is_weight_p05"] for r in rows],
        [r["train/is_weight_p95"] for r in rows],
        alpha=0.3,
        label="p05–p95",
    )
    ax.plot(steps, [r["train/is_weight_p50"] for r in rows], label="median")
    ax.plot(steps, [r.get("train/is_weight_max", float("nan")) for r in rows], ".", label="max")
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_yscale("log")
    ax.set_xlabel("policy version (step)")
    ax.set_ylabel("importance weight π_prox/π_behav")
    ax.legend(fontsize=7)
    return True


def write_distributions(plt, runs: dict[str, dict], out_dir: Path) -> Path | None:
    """distributions.png for ``runs`` ({run name: {role: records}}); None without data."""
    learners = {name: series.get("learner", []) for name, series in runs.items()}
    learners = {name: recs for name, recs in learners.items() if recs}
    if not learners:
        return None
    fig, axes = plt.subplots(len(learners), 3, figsize=(18, 3.8 * len(learners)), squeeze=False)
    drawn = False
    for row, (name, recs) in zip(axes, learners.items()):
        drawn |= _staleness_panels(row[0], row[1], recs)
        drawn |= _weight_panel(row[2], recs)
        row[0].set_title(f"staleness over steps [{name}]", fontsize=9)
        row[1].set_title(f"staleness over the run [{name}]", fontsize=9)
        row[2].set_title(f"importance weights [{name}]", fontsize=9)
        for ax in row:
            ax.grid(alpha=0.3)
    if not drawn:
        plt.close(fig)
        return None
    fig.suptitle("Distributions of staleness and importance weights")
    fig.tight_layout()
    path = out_dir / "distributions.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
