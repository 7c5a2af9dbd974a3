"""`dapo-async tune CONFIG --search KEY=low:high[:log] … --trials N`: a hyper-parameter search
with Optuna (TPE sampling; median or successive-halving pruning on the learning curve).

Each trial is one short training run (`dapo-async train`, ``--steps`` steps, held-out evaluation
every ``--eval-every`` steps) in ``<out>/<out name>-tNNN``, an Aim run tagged with its values.
While it runs the search reads its metrics: every held-out evaluation (objective ``heldout``),
or every step's reward or samples/s, is reported to Optuna, and a trial the pruner stops is ended
at once (Ctrl-C to its launcher, which stops every role). The first trial is the config as given
(its values of the searched keys, where they lie in the ranges), so the best trial is compared
with the default at the same step budget; both are printed.

    trial ─► train (subprocess) ─► metrics/*.jsonl ─► trial.report(value, step)
                   ▲                                        │ should_prune?
                   └──── SIGINT ◄───────────────────────────┘

The study lives in ``<out>/study.db`` (SQLite), so ``--resume`` continues it; the best trial's
resolved config is written to ``<out>/best.yaml``, ready for `dapo-async train`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from dapo_async.tracking import read_metrics

OBJECTIVES = {
    # name: the metric (learner's or evaluator's records) its curve is made of
    "heldout": "eval/accuracy",
    "reward": "rollout/reward_mean",
    "samples_per_s": "learner/samples_per_s",
}
# How often a running trial's metrics are read.
POLL_S = 1.0
# A pruned or timed-out trial's launcher gets this long to stop its roles after Ctrl-C.
STOP_WAIT_S = 60.0
STUDY_NAME = "tune"
# A trial whose learner has logged no step this long after its start is ended as failed (a
# config that never trains, e.g. dynamic sampling filtering every group, must not stall the
# search); generous against the ~20 s start-up of the tiny job on 2 cores.
FIRST_STEP_TIMEOUT_S = 600.0


@dataclass
class Space:
    key: str
    low: float
    high: float
    log: bool
    integer: bool


def parse_space(items: list[str]) -> list[Space]:
    """``KEY=low:high[:log]`` each; integers when both bounds are written as integers."""
    out = []
    for item in items:
        key, sep, rng = item.partition("=")
        parts = rng.split(":")
        if not sep or not key or len(parts) not in (2, 3) or parts[2:] not in ([], ["log"]):
            raise SystemExit(f"tune: --search wants KEY=low:high[:log], got {item!r}")
        try:
            low, high = float(parts[0]), float(parts[1])
        except ValueError:
            raise SystemExit(f"tune: --search {key}: bounds must be numbers, got {rng!r}") from None
        log = parts[2:] == ["log"]
        if not low < high or (log and low <= 0):
            raise SystemExit(f"tune: --search {key}: need low < high (and low > 0 with :log)")
        integer = all(p.lstrip("-").isdigit() for p in parts[:2])
        out.append(Space(key, low, high, log, integer))
    return out


def suggest(trial, space: list[Space]) -> dict:
    return {
        s.key: (
            trial.suggest_int(s.key, int(s.low), int(s.high), log=s.log)
            if s.integer
            else trial.suggest_float(s.key, s.low, s.high, log=s.log)
        )
        for s in space
    }


def defaults(cfg, space: list[Space]) -> dict | None:
    """The config's own values of the searched keys, if every one lies in its range."""
    values = {}
    for s in space:
        node = cfg
        for part in s.key.split("."):
            node = getattr(node, part)
        if not s.low <= float(node) <= s.high:
            return None
        values[s.key] = int(node) if s.integer else float(node)
    return values


def curve(run_dir: Path, objective: str) -> list[tuple[int, float]]:
    """(step, value) of the objective so far: held-out evaluations after step 0 (the warm start
    is every trial's), or every step's reward or samples/s."""
    metric = OBJECTIVES[objective]
    points = {}
    for role in ("learner", "evaluator"):
        for r in read_metrics(run_dir, role):
            value = r.get(metric)
            if value is not None and math.isfinite(value) and r["step"] > 0:
                points[int(r["step"])] = float(value)
    return sorted(points.items())


def run_trial(trial, cmd: list[str], run_dir: Path, objective: str, deadline: float) -> float:
    """Train, report the curve as it grows, stop early when pruned; the final value."""
    import optuna

    log_path = run_dir.with_name(run_dir.name + ".log")  # the launcher's output (a pipe could fill)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=log, start_new_session=True)
        reported: set[int] = set()
        pruned = late = False
        stalled_at = time.monotonic() + FIRST_STEP_TIMEOUT_S
        while proc.poll() is None:
            time.sleep(POLL_S)
            if time.monotonic() > stalled_at and not read_metrics(run_dir, "learner")[1:]:
                _stop(proc)
                raise RuntimeError(f"no learner step in {FIRST_STEP_TIMEOUT_S:.0f} s ({run_dir})")
            for step, value in curve(run_dir, objective):
                if step not in reported:
                    reported.add(step)
                    trial.report(value, step)
                    pruned = pruned or trial.should_prune()
            late = time.monotonic() > deadline
            if pruned or late:
                _stop(proc)
                break
    if pruned:
        raise optuna.TrialPruned(f"pruned at step {max(reported)}")
    if late:
        raise RuntimeError("stopped: --budget-s reached")
    if proc.returncode != 0:
        tail = log_path.read_text()[-1500:]
        raise RuntimeError(f"training failed ({run_dir}, exit {proc.returncode}): {tail}")
    points = curve(run_dir, objective)
    if not points:
        raise RuntimeError(f"no {OBJECTIVES[objective]} reported ({run_dir})")
    return points[-1][1]


def _stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGINT)  # the launcher stops every role (≤ 30 s)
    try:
        proc.wait(STOP_WAIT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def main(args: argparse.Namespace) -> int:

    from dapo_async.config import ConfigError, load_config

    space = parse_space(args.search)
    if args.objective not in OBJECTIVES:
        raise SystemExit(f"tune: --objective must be one of {sorted(OBJECTIVES)}")
    root = Path(args.out) if args.out else Path("runs") / f"tune-{time.strftime('%Y%m%d-%H%M%S')}"
    db = root / "study.db"
    if db.exists() and not args.resume:
        raise SystemExit(f"tune: {db} exists: --resume continues that study, or choose --out")
    root.mkdir(parents=True, exist_ok=True)
    eval_every = args.eval_every or max(1, args.steps // 4)
    aim_repo = root.resolve().parent / "aim"
    base = [
        f"learner.num_steps={args.steps}",
        f"learner.eval_every={eval_every}",
        f"tracking.aim_repo={aim_repo}",
        *args.overrides,
    ]
    try:
        given = load_config(args.config, base)  # fail fast on a bad key or value
    except ConfigError as e:
        raise SystemExit(f"tune: {e}") from None
    study = open_study(db, args.pruner, eval_every, args.seed)
    start = defaults(given, space)
    if start is not None and not study.trials:
        study.enqueue_trial(start, user_attrs={"default": True})
    deadline = time.monotonic() + (args.budget_s or float("inf"))

    def objective(trial) -> float:
        values = suggest(trial, space)
        tags = ",".join(f"{k}={v:.4g}" for k, v in values.items())
        run_dir = root / f"{root.name}-t{trial.number:03d}"
        trial.set_user_attr("run_dir", str(run_dir))
        cmd = [sys.executable, "-m", "dapo_async.cli", "train", args.config, f"run_dir={run_dir}"]
        cmd += [*base, *(f"{k}={v}" for k, v in values.items()), f"tracking.tags=[{tags}]"]
        print(f"[tune] trial {trial.number} {values}", file=sys.stderr, flush=True)
        return run_trial(trial, cmd, run_dir, args.objective, deadline)

    remaining = max(0, args.trials - len([t for t in study.trials if t.state.is_finished()]))
    study.optimize(
        objective,
        n_trials=remaining,
        catch=(RuntimeError,),
        callbacks=[_stop_at(deadline)],
    )
    return report(study, root, args)


def open_study(db: Path, pruner: str, eval_every: int, seed: int):
    """The study in ``db`` (created, or loaded to resume): maximise; TPE; the pruner."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.create_study(
        study_name=STUDY_NAME,
        storage=f"sqlite:///{db.resolve()}",
        load_if_exists=True,
        direction="maximize",
        sampler=optuna.samplers.TPESampler(seed=seed),
        pruner=optuna.pruners.SuccessiveHalvingPruner()
        if pruner == "halving"
        else optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=eval_every),
    )


def _stop_at(deadline: float):
    def callback(study, trial) -> None:
        if time.monotonic() > deadline:
            study.stop()

    return callback


def report(study, root: Path, args: argparse.Namespace) -> int:
    """Print the trials, write best.yaml, and the JSON line."""
    from optuna.trial import TrialState

    trials = []
    for t in study.trials:
        trials.append(
            {
                "number": t.number,
                "state": t.state.name.lower(),
                "value": t.value,
                "params": t.params,
                "last_step": max(t.intermediate_values, default=None),
                "default": bool(t.user_attrs.get("default")),
                "run_dir": t.user_attrs.get("run_dir"),
            }
        )
        v = "      —" if t.value is None else f"{t.value:7.3f}"
        print(
            f"[tune] trial {t.number:3d} {t.state.name.lower():8s} {v}  {t.params}", file=sys.stderr
        )
    done = [t for t in study.trials if t.state == TrialState.COMPLETE]
    if not done:
        print("tune: no trial completed", file=sys.stderr)
        return 1
    best = study.best_trial
    default = next((t for t in trials if t["default"] and t["state"] == "complete"), None)
    best_yaml = root / "best.yaml"
    src = Path(best.user_attrs["run_dir"]) / "config.yaml"
    if src.exists():
        best_yaml.write_text(
            f"# dapo-async tune: trial {best.number}, {args.objective} {best.value:.4f} after "
            f"{args.steps} steps ({best.params})\n" + src.read_text()
        )
    out = {
        "objective": args.objective,
        "best": {"number": best.number, "value": best.value, "params": best.params},
        "default": None
        if default is None
        else {"number": default["number"], "value": default["value"]},
        "pruned": sum(t["state"] == "pruned" for t in trials),
        "trials": trials,
        "best_yaml": str(best_yaml),
        "study": str(root / "study.db"),
    }
    dflt = "n/a" if default is None else f"{default['value']:.3f}"
    print(
        f"[tune] best trial {best.number}: {args.objective} {best.value:.3f} {best.params}; "
        f"default config {dflt}; {out['pruned']} pruned; best config: {best_yaml}",
        file=sys.stderr,
    )
    if args.json:
        print(json.dumps(out))
    return 0
