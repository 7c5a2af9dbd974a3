"""`dapo-async bench ablation`: DAPO against naive GRPO on the same job, several seeds, one run.

Trains the DAPO config (``--config``, default the tiny CPU job) and the naive-GRPO baseline
(``--baseline``: symmetric clip, sequence-mean loss, no dynamic sampling, no overlong shaping;
everything else equal) once per seed with the launcher (`dapo-async train`), in the order
seed 0 DAPO, seed 0 GRPO, seed 1 DAPO, … so machine noise falls on both arms alike. With
``--components`` it also trains the baseline plus one DAPO component at a time (the DAPO paper's
ablation, one component each instead of cumulatively), which shows where the margin comes from.
With ``--sync`` it also trains the DAPO config synchronously (``buffer.max_staleness=0``), which
shows what asynchrony costs in accuracy (``async_gap``). With ``--stream`` it trains DAPO with batch and with
stream generation (``generator.mode``), for ``stream_gap`` = stream − batch held-out after
training, to be read against ``dapo_heldout_after_std`` (the batch arm's seed spread).

Figures per arm, averaged over seeds:

- ``heldout_after``: held-out greedy accuracy after the last step (the main figure);
- ``curve_mean``: mean held-out accuracy over the evaluations every ``--eval-every`` steps
  (learning speed and stability: a run that dips in the middle scores lower);
- ``groups_generated``: groups the generators produced (dynamic sampling generates more per
  step; this is its cost), and ``train_seconds``.

``margin`` = DAPO − GRPO mean held-out accuracy after training; ``dapo_wins`` counts the seeds
where DAPO ended higher; ``async_gap`` (with ``--sync``) = DAPO as configured − DAPO
synchronous. `dapo-async train` with the seed as ``seed=S`` changes sampling, prompt order and
the held-out sample; the warm-started model is the same for every run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from dapo_async.bench.common import heldout_accuracy, heldout_curve, parse_seeds, run_train

# One DAPO component at a time on top of the naive-GRPO baseline (--components).
COMPONENTS: dict[str, list[str]] = {
    "clip_higher": ["algo.objective=dapo", "algo.clip_high=0.28"],
    "token_mean": ["algo.loss_agg=token-mean"],
    "overlong_shaping": ["reward.overlong_shaping=true"],
    "dynamic_sampling": ["buffer.dynamic_sampling=true"],
}


def read_run(run_dir: Path) -> dict[str, float]:
    """Held-out accuracy before/after and over the run, groups generated, training time."""
    curve = [accuracy for _, accuracy in heldout_curve(run_dir)]
    before, after = heldout_accuracy(run_dir, "before"), heldout_accuracy(run_dir, "after")
    if not curve or curve[-1] != after:  # the final evaluation is tracked with the last step
        curve.append(after)
    counters = json.loads((run_dir / "buffer_final.json").read_text())["counters"]
    summary = json.loads((run_dir / "learner_summary.json").read_text())
    return {
        "heldout_before": before,
        "heldout_after": after,
        "curve_mean": sum(curve) / len(curve),
        "groups_generated": float(counters["produced"]),
        "train_seconds": float(summary["seconds"]),
    }


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def make_arms(args) -> dict[str, tuple[str, list[str]]]:
    """Arm name → (config, extra overrides) for the options given."""
    arms: dict[str, tuple[str, list[str]]] = {
        "dapo": (args.config, []),
        "grpo": (args.baseline, []),
    }
    if args.sync:
        arms["dapo_sync"] = (args.config, ["buffer.max_staleness=0"])
    if args.stream:
        arms["dapo_batch"] = (args.config, ["generator.mode=batch"])
        arms["dapo_stream"] = (args.config, ["generator.mode=stream"])
    if args.components:
        for name, extra in COMPONENTS.items():
            arms[f"grpo+{name}"] = (args.baseline, extra)
    return arms


def summarize(results: dict[str, list[dict]], keys: dict[str, str], seeds, num_steps, sync):
    """The JSON line: per-arm figures averaged over seeds, margins, wins, the async gap."""
    out: dict = {"seeds": seeds, "steps": num_steps}
    for name, runs in results.items():
        key = keys[name]
        out[f"{key}_heldout_after"] = [r["heldout_after"] for r in runs]
        for fig in ("heldout_after", "curve_mean", "groups_generated", "train_seconds"):
            out[f"{key}_{fig}_mean"] = _mean([r[fig] for r in runs])
    out["heldout_before"] = [r["heldout_before"] for r in results["dapo"]]
    out["margin"] = out["dapo_heldout_after_mean"] - out["grpo_heldout_after_mean"]
    out["curve_margin"] = out["dapo_curve_mean_mean"] - out["grpo_curve_mean_mean"]
    out["dapo_wins"] = sum(
        d["heldout_after"] > g["heldout_after"] for d, g in zip(results["dapo"], results["grpo"])
    )
    if sync:
        out["async_gap"] = out["dapo_heldout_after_mean"] - out["dapo_sync_heldout_after_mean"]
    if "dapo_stream" in results:
        # stream vs batch generation, and the seed noise to judge it by
        out["stream_gap"] = (
            out["dapo_stream_heldout_after_mean"] - out["dapo_batch_heldout_after_mean"]
        )
        out["dapo_heldout_after_std"] = statistics.pstdev(out["dapo_batch_heldout_after"])
    return out


def print_table(out: dict, keys: dict[str, str], num_seeds: int, sync: bool) -> None:
    print(
        "\narm                        held-out after   curve mean   groups generated",
        file=sys.stderr,
    )
    for name, key in keys.items():
        print(
            f"{name:26s} {out[f'{key}_heldout_after_mean']:14.3f} "
            f"{out[f'{key}_curve_mean_mean']:12.3f} {out[f'{key}_groups_generated_mean']:18.0f}",
            file=sys.stderr,
        )
    print(
        f"DAPO − GRPO: {out['margin']:+.3f} held-out after training, {out['curve_margin']:+.3f} "
        f"over the run; DAPO ahead on {out['dapo_wins']} of {num_seeds} seeds",
        file=sys.stderr,
    )
    if sync:
        print(
            f"DAPO as configured − DAPO synchronous: {out['async_gap']:+.3f} held-out after "
            "training",
            file=sys.stderr,
        )
    if "stream_gap" in out:
        print(
            f"DAPO stream − batch generation: {out['stream_gap']:+.3f} held-out after "
            f"training (seed std of the batch arm {out['dapo_heldout_after_std']:.3f})",
            file=sys.stderr,
        )


def main(args: argparse.Namespace) -> int:
    from dapo_async.config import load_config

    seeds = parse_seeds(args.seeds)
    base = [
        "tracking.aim=false",
        f"learner.eval_every={args.eval_every}",
        *([f"learner.num_steps={args.steps}"] if args.steps is not None else []),
        *args.overrides,
    ]
    # Fail fast on a bad override or config, before minutes of training.
    num_steps = load_config(args.config, base).learner.num_steps
    load_config(args.baseline, base)
    arms = make_arms(args)
    keys = {name: name.replace("+", "_plus_") for name in arms}  # "+" is awkward in keys
    root = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="dapo-bench-ablation-"))
    results: dict[str, list[dict[str, float]]] = {name: [] for name in arms}
    for seed in seeds:
        for name, (config, extra) in arms.items():
            run_dir = root / f"{name}-seed{seed}"
            run_train(config, [*base, *extra, f"seed={seed}"], run_dir, tag="bench ablation")
            r = read_run(run_dir)
            results[name].append(r)
            print(
                f"[bench ablation] seed {seed} {name}: held-out {r['heldout_before']:.3f} → "
                f"{r['heldout_after']:.3f} (curve mean {r['curve_mean']:.3f}, "
                f"{r['groups_generated']:.0f} groups generated, {r['train_seconds']:.0f}s)",
                file=sys.stderr,
                flush=True,
            )
    out = summarize(results, keys, seeds, num_steps, args.sync)
    out["run_root"] = str(root)
    print_table(out, keys, len(seeds), args.sync)
    if args.json:
        print(json.dumps(out))
    return 0
