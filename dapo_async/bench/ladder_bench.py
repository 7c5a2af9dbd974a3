"""`dapo-async bench ladder`: the DAPO paper's ladder and the asynchronous ladder, several seeds.

``--ladder paper`` trains the config (default configs/tiny_long.yaml: mixed 2-8 step chains,
max_tokens below the longest solutions) as naive GRPO, then adds DAPO's components one at a
time, cumulatively, in the paper's order: overlong filtering → clip-higher → soft overlong
punishment → token-level loss → dynamic sampling (= the config, DAPO). Each arm runs
``learner.num_steps`` steps.

``--ladder async`` trains DAPO with ``buffer.max_staleness`` 0, 1, 2, 4, each with the decoupled
objective (proximal log-probs recomputed by the learner) and with the naive one (behaviour
log-probs used as proximal, ``algo.bypass=true``), all at one wall-clock budget
(``learner.time_budget_s=--budget-s``): asynchrony buys more steps in the same time, staleness
costs accuracy per step, and the objective decides how much.

Every run evaluates held-out greedy accuracy every ``--eval-every`` steps. Per arm, over seeds:
``after`` (mean and std of the final held-out accuracy), ``curve_mean`` (mean over the
evaluations), ``steps``, ``seconds_to_target`` (mean training seconds, evaluations excluded,
until held-out accuracy first reached ``--target``; runs that never did count as their whole training time and are
counted in ``missed_target``). Runs are interleaved by seed (seed 0 every arm, seed 1 every arm,
…) so machine noise falls on all arms alike. PNG plots go into ``--out`` (``ladder.png``: final
accuracy per arm; ``curves.png``: held-out accuracy against steps or seconds).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from dapo_async.bench.common import heldout_accuracy, heldout_curve, parse_seeds, run_train
from dapo_async.tiny.build import cpu_model
from dapo_async.tracking import read_metrics

# Naive GRPO: what the ladder's first arm turns off in the DAPO config.
NAIVE_GRPO = [
    "algo.objective=grpo",
    "algo.clip_high=0.2",
    "algo.loss_agg=seq-mean-token-mean",
    "algo.overlong_filter=false",
    "reward.overlong_shaping=false",
    "buffer.dynamic_sampling=false",
]
# The paper's ladder, cumulative: each rung adds its overrides to all rungs before it.
PAPER_RUNGS: list[tuple[str, list[str]]] = [
    ("grpo", []),
    ("+overlong_filter", ["algo.overlong_filter=true"]),
    ("+clip_higher", ["algo.objective=dapo", "algo.clip_high=0.28"]),
    ("+soft_overlong", ["reward.overlong_shaping=true"]),
    ("+token_mean", ["algo.loss_agg=token-mean"]),
    ("+dynamic_sampling", ["buffer.dynamic_sampling=true"]),
]
STALENESS = (0, 1, 2, 4)
# An async run's step cap: the wall-clock budget ends it long before.
ASYNC_MAX_STEPS = 10_000


def paper_arms() -> dict[str, list[str]]:
    arms, acc = {}, list(NAIVE_GRPO)
    for name, extra in PAPER_RUNGS:
        acc = acc + extra
        arms[name] = list(acc)
    return arms


def async_arms(budget_s: float) -> dict[str, list[str]]:
    arms = {}
    for objective, bypass in (("decoupled", "false"), ("naive", "true")):
        for s in STALENESS:
            arms[f"{objective}-stale{s}"] = [
                f"buffer.max_staleness={s}",
                f"algo.bypass={bypass}",
                f"learner.time_budget_s={budget_s}",
                f"learner.num_steps={ASYNC_MAX_STEPS}",
            ]
    return arms


def read_curve(run_dir: Path) -> dict:
    """Held-out evaluations of one run: steps, training seconds, accuracies; and the final one."""
    curve = heldout_curve(run_dir)
    after = heldout_accuracy(run_dir, "after")
    summary = json.loads((run_dir / "learner_summary.json").read_text())
    train_s = float(summary.get("train_seconds", summary["seconds"]))
    # training seconds (evaluations excluded) at each evaluated step: 0 before training, the
    # step's own figure after it, the run's total where the step has none (the final one)
    at_step = {
        int(r["step"]): r["learner/train_seconds"]
        for r in read_metrics(run_dir, "learner")
        if "learner/train_seconds" in r and "step" in r
    }
    return {
        "steps": [step for step, _ in curve],
        "seconds": [0.0 if step == 0 else at_step.get(step, train_s) for step, _ in curve],
        "accuracy": [accuracy for _, accuracy in curve],
        "after": after,
        "num_steps": int(summary["steps"]),
        "train_seconds": train_s,
    }


def summarize_arm(runs: list[dict], target: float) -> dict:
    after = [r["after"] for r in runs]
    to_target, missed = [], 0
    for r in runs:
        hit = next((s for s, a in zip(r["seconds"], r["accuracy"]) if a >= target), None)
        missed += hit is None
        to_target.append(r["train_seconds"] if hit is None else hit)
    return {
        "after": after,
        "after_mean": statistics.fmean(after),
        "after_std": statistics.stdev(after) if len(after) > 1 else 0.0,
        "curve_mean": statistics.fmean(statistics.fmean(r["accuracy"]) for r in runs),
        "steps_mean": statistics.fmean(r["num_steps"] for r in runs),
        "seconds_to_target": statistics.fmean(to_target),
        "missed_target": missed,
    }


def plot(results: dict[str, list[dict]], summary: dict[str, dict], out: Path, x: str) -> None:
    """ladder.png (final accuracy, mean ± std per arm) and curves.png (mean curve per arm)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(summary)
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(names)), 4))
    ax.bar(
        range(len(names)),
        [summary[n]["after_mean"] for n in names],
        yerr=[summary[n]["after_std"] for n in names],
        capsize=4,
    )
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right")
    ax.set_ylabel("held-out accuracy after training")
    ax.set_ylim(0, 1)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "ladder.png", dpi=110)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for n in names:
        runs = results[n]
        k = min(len(r[x]) for r in runs)
        xs = [statistics.fmean(r[x][i] for r in runs) for i in range(k)]
        ys = [statistics.fmean(r["accuracy"][i] for r in runs) for i in range(k)]
        ax.plot(xs, ys, marker="o", ms=3, label=n)
    ax.set_xlabel("learner step" if x == "steps" else "training seconds")
    ax.set_ylabel(f"held-out accuracy (mean of {len(next(iter(results.values())))} seeds)")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "curves.png", dpi=110)
    plt.close(fig)


def main(args: argparse.Namespace) -> int:
    from dapo_async.config import load_config

    seeds = parse_seeds(args.seeds)
    base = ["tracking.aim=false", f"learner.eval_every={args.eval_every}", *args.overrides]
    if args.steps is not None:
        base.append(f"learner.num_steps={args.steps}")
    arms = paper_arms() if args.ladder == "paper" else async_arms(args.budget_s)
    for extra in arms.values():  # fail fast on a bad override, before minutes of training
        load_config(args.config, [*extra, *base])
    root = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="dapo-bench-ladder-"))
    t0 = time.monotonic()
    results: dict[str, list[dict]] = {name: [] for name in arms}
    for seed in seeds:
        for name, extra in arms.items():
            run_dir = root / f"{name.lstrip('+')}-seed{seed}"
            # arm overrides first: the user's overrides (base) win
            run_train(args.config, [*extra, *base, f"seed={seed}"], run_dir, tag="bench ladder")
            r = read_curve(run_dir)
            results[name].append(r)
            print(
                f"[bench ladder] seed {seed} {name}: held-out {r['accuracy'][0]:.3f} → "
                f"{r['after']:.3f} in {r['num_steps']} steps, {r['train_seconds']:.0f}s",
                file=sys.stderr,
                flush=True,
            )
    summary = {name: summarize_arm(runs, args.target) for name, runs in results.items()}
    plot(results, summary, root, "steps" if args.ladder == "paper" else "seconds")
    print(
        f"\n{'arm':22s} {'after (mean ± std)':>20s} {'curve':>7s} {'steps':>6s} "
        f"{'s to ' + str(args.target):>9s}",
        file=sys.stderr,
    )
    for name, s in summary.items():
        print(
            f"{name:22s} {s['after_mean']:13.3f} ± {s['after_std']:.3f} {s['curve_mean']:7.3f} "
            f"{s['steps_mean']:6.0f} {s['seconds_to_target']:9.0f}"
            + (f" ({s['missed_target']} missed)" if s["missed_target"] else ""),
            file=sys.stderr,
        )
    out = {
        "ladder": args.ladder,
        "config": args.config,
        "seeds": seeds,
        "target": args.target,
        "arms": summary,
        "cpu_model": cpu_model(),
        "minutes": round((time.monotonic() - t0) / 60, 2),
        "plots": [str(root / "ladder.png"), str(root / "curves.png")],
        "run_root": str(root),
    }
    if args.ladder == "async":
        out["budget_s"] = args.budget_s
    (root / "ladder.json").write_text(json.dumps(out, indent=2))
    if args.json:
        print(json.dumps(out))
    return 0
