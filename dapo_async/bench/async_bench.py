"""`dapo-async bench async`: synchronous vs asynchronous training throughput, measured in one run.

Runs the same training job twice with the launcher (`dapo-async train`), first synchronous
(``buffer.max_staleness=0``: generation and training alternate) then asynchronous
(``buffer.max_staleness=--staleness``: they overlap), and reads each learner's metrics:

- ``*_samples_per_s``: responses trained per second in steady state: from the end of step
  ``1 + staleness`` to the end of the last step, in both runs (start-up, the first generation and
  the backlog an asynchronous run may build before its first step are excluded);
- ``*_learner_idle``: the learner's share of that time spent waiting for data;
- ``speedup`` = async ÷ sync samples/s; held-out accuracy before and after each run.

The default is the tiny CPU job (one learner, one generator, one torch thread each).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from dapo_async.bench.common import heldout_accuracy, print_result, run_train
from dapo_async.tracking import read_metrics


def steady_state(run_dir: Path, skip: int = 1) -> dict[str, float]:
    """Figures over the learner steps after the first ``skip`` ones."""
    recs = [r for r in read_metrics(run_dir, "learner") if "rollout/num_responses" in r]
    if len(recs) < skip + 2:
        raise RuntimeError(f"{run_dir}: fewer than {skip + 2} learner steps recorded")
    window = recs[skip:]
    elapsed = window[-1]["time"] - recs[skip - 1]["time"]
    samples = sum(r["rollout/num_responses"] for r in window)
    waited = sum(r["time/wait_data_s"] for r in window)
    out = {
        "samples_per_s": samples / elapsed,
        "learner_idle": waited / elapsed,
        "steps": float(len(recs)),
        "staleness_mean": sum(r["staleness/mean"] for r in window) / len(window),
    }
    for when in ("before", "after"):
        if (run_dir / f"eval_{when}.json").exists():
            out[f"heldout_{when}"] = heldout_accuracy(run_dir, when)
    return out


def run_job(config: str, overrides: list[str], run_dir: Path, skip: int) -> dict[str, float]:
    run_train(config, overrides, run_dir)
    return steady_state(run_dir, skip)


# Learner steps per run unless --steps says otherwise.
DEFAULT_STEPS = 24


def main(args: argparse.Namespace) -> int:
    steps = DEFAULT_STEPS if args.steps is None else args.steps
    base = [f"learner.num_steps={steps}", "tracking.aim=false", *args.overrides]
    root = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="dapo-bench-async-"))
    skip = 1 + args.staleness
    if steps < skip + 2:
        raise SystemExit(
            f"bench async: --steps must be at least {skip + 2} for --staleness {args.staleness}"
        )
    sync = run_job(args.config, [*base, "buffer.max_staleness=0"], root / "sync", skip)
    asyn = run_job(
        args.config, [*base, f"buffer.max_staleness={args.staleness}"], root / "async", skip
    )
    out = {
        "steps": steps,
        "steady_state_from_step": skip,
        "max_staleness": args.staleness,
        "sync_samples_per_s": sync["samples_per_s"],
        "async_samples_per_s": asyn["samples_per_s"],
        "speedup": asyn["samples_per_s"] / sync["samples_per_s"],
        "sync_learner_idle": sync["learner_idle"],
        "async_learner_idle": asyn["learner_idle"],
        "async_staleness_mean": asyn["staleness_mean"],
        "heldout_before": sync.get("heldout_before"),
        "sync_heldout_after": sync.get("heldout_after"),
        "async_heldout_after": asyn.get("heldout_after"),
        "run_dirs": [str(root / "sync"), str(root / "async")],
    }
    return print_result(
        f"sync {out['sync_samples_per_s']:.1f} samples/s (learner idle "
        f"{out['sync_learner_idle']:.2f}); async (max_staleness={args.staleness}) "
        f"{out['async_samples_per_s']:.1f} samples/s (learner idle "
        f"{out['async_learner_idle']:.2f}); speedup {out['speedup']:.2f}x",
        out,
        args.json,
    )
