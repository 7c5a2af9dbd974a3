"""Pieces every training bench shares: one `dapo-async train` job in a subprocess, the policy of
a bench that runs its engine in-process, seed lists from the command line, and the closing
lines (a human summary on stderr, then the JSON line)."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

from dapo_async.tracking import read_jsonl, read_metrics

# Where Linux describes the first core's caches (level, type, size per index*/ folder).
CPU_CACHE_DIR = Path("/sys/devices/system/cpu/cpu0/cache")


def machine(cache_dir: Path = CPU_CACHE_DIR) -> str:
    """This machine in words for a bench's figures: the CPU's model name, its cores and its
    data caches, e.g. "AMD EPYC, 2 cores, L1d 48K, L2 1024K, L3 32768K" (two machines of one
    model name, such as "AMD EPYC", can differ twofold in speed; their caches tell them apart)."""
    from dapo_async.tiny.build import cpu_model

    caches = []
    for index in sorted(cache_dir.glob("index*")):
        try:
            level, kind, size = (
                (index / name).read_text().strip() for name in ("level", "type", "size")
            )
        except OSError:
            continue
        if kind in ("Data", "Unified"):
            caches.append(f"L{level}{'d' if kind == 'Data' else ''} {size}")
    return ", ".join([cpu_model(), f"{os.cpu_count()} cores", *caches])


def run_train(config: str, overrides: list[str], run_dir: Path, tag: str = "bench async") -> None:
    """One `dapo-async train` job in ``run_dir``; raises RuntimeError with its stderr tail."""
    cmd = [sys.executable, "-m", "dapo_async.cli", "train", config, f"run_dir={run_dir}"]
    cmd += overrides
    print(f"[{tag}] {' '.join(cmd[3:])}", file=sys.stderr, flush=True)
    res = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"training failed ({run_dir}):\n{res.stderr[-2000:]}")


def ensure_policy(cfg) -> str:
    """The policy directory of ``cfg``; the built-in tiny policy (``model.path`` empty) is built
    or reused first, as `dapo-async train` does, so a bench runs on a fresh clone."""
    if not cfg.model.path:
        from dapo_async.launch.train import build_tiny_policy

        build_tiny_policy(cfg)
    return cfg.model.source_dir


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


def learner_window(run_dir: Path, skip: int) -> tuple[dict, list[dict]]:
    """The steady-state window of a run's learner: the step record just before it (its start)
    and the step records after the first ``skip`` steps."""
    recs = [r for r in read_metrics(run_dir, "learner") if "rollout/num_responses" in r]
    if len(recs) < skip + 2:
        raise RuntimeError(f"{run_dir}: fewer than {skip + 2} learner steps recorded")
    return recs[skip - 1], recs[skip:]


def window_rates(start: dict, window: list[dict]) -> dict[str, float]:
    """Trained samples/s and the learner's idle share over a ``learner_window``."""
    elapsed = window[-1]["time"] - start["time"]
    return {
        "samples_per_s": sum(r["rollout/num_responses"] for r in window) / elapsed,
        "learner_idle": sum(r["time/wait_data_s"] for r in window) / elapsed,
    }


# Parts of the steady-state window ``window_phases`` reports: beginning, middle and end.
PHASES = 3


def window_phases(start: dict, window: list[dict], parts: int = PHASES) -> list[dict]:
    """A ``learner_window`` cut into ``parts`` runs of consecutive steps; per part the
    learner's idle share and ``produced_per_qualified``, the groups the generators made per
    group that passed dynamic sampling. The second climbs as the policy masters the task (its
    groups turn all-correct) and drags the first with it: the generator's work per trained
    group grows while the learner's stays the same."""
    records, n = [start, *window], len(window)
    bounds = [round(i * n / parts) for i in range(parts + 1)]
    out = []
    for a, b in itertools.pairwise(bounds):
        if b <= a:
            continue
        first, last = records[a], window[b - 1]
        elapsed = last["time"] - first["time"]
        # the buffer's counters ride on each step's reply (absent: NaN)
        qualified = last.get("buffer/qualified", 0) - first.get("buffer/qualified", 0)
        produced = last.get("buffer/produced", 0) - first.get("buffer/produced", 0)
        out.append(
            {
                "steps": [int(window[a]["step"]), int(last["step"])],
                "learner_idle": sum(r["time/wait_data_s"] for r in window[a:b]) / elapsed,
                "produced_per_qualified": produced / qualified if qualified else float("nan"),
            }
        )
    return out


def spare_cpu_s(run_dir: Path, t0: float, t1: float) -> float:
    """CPU seconds the spare generators (``launch.spare_generators``) used between wall times
    ``t0`` and ``t1``: their reported ``cores/cpu_s`` at the last report before each (a spare
    runs at idle priority only while the learner waits, so this is the learner's wait that went
    to generation instead of nothing)."""
    total = 0.0
    for path in sorted((Path(run_dir) / "metrics").glob("spare*.jsonl")):
        recs = [(r["time"], r["cores/cpu_s"]) for r in read_jsonl(path) if "cores/cpu_s" in r]
        if recs:
            total += _value_at(recs, t1) - _value_at(recs, t0)
    return total


def _value_at(recs: list[tuple[float, float]], t: float) -> float:
    """A counter's last reported value at time ``t`` (its first one when none came before:
    what it counted before its first report, start-up included, is left out)."""
    return max((c for w, c in recs if w <= t), default=recs[0][1])


def window_core_idle(run_dir: Path, start: dict, window: list[dict]) -> dict[str, float]:
    """Over a ``learner_window``: the spares' CPU seconds, and ``learner_core_idle``, the
    share of the time the learner waited *and* no spare computed on the core it lent (its
    wait less the spares' CPU time, never below 0); the learner's idle share without spares."""
    t0, t1 = start["time"], window[-1]["time"]
    waited = sum(r["time/wait_data_s"] for r in window)
    spare = spare_cpu_s(run_dir, t0, t1)
    return {"spare_cpu_s": spare, "learner_core_idle": max(waited - spare, 0.0) / (t1 - t0)}


def generators_busy_share(run_dir: Path, t0: float, t1: float) -> float:
    """The generator cores' worth of work between wall times ``t0`` and ``t1``: per generator
    (spares aside), the share of the reports bracketing the window it was not idle
    (``generator/idle_s``), summed; a generator with fewer than two reports counts as busy
    throughout."""
    total = 0.0
    for path in sorted((Path(run_dir) / "metrics").glob("*.jsonl")):
        if path.stem.startswith("spare"):  # their CPU seconds: spare_cpu_s
            continue
        recs = [
            (r["time"], r["generator/idle_s"]) for r in read_jsonl(path) if "generator/idle_s" in r
        ]
        if not recs:
            continue
        first = max((w for w, _ in recs if w <= t0), default=recs[0][0])
        last = max((w for w, _ in recs if w <= t1), default=recs[0][0])
        if last - first <= 0:
            total += 1.0
            continue
        idle = _value_at(recs, last) - _value_at(recs, first)
        total += min(max(1.0 - idle / (last - first), 0.0), 1.0)
    return total


def wait_floor(learner_busy_s: float, generation_s: float, cores: int) -> float:
    """The share of a window the learner would still wait if the cores were split between the
    roles perfectly: the learner computes on one core at most, so a window can shrink no
    further than max(its own work, all the work ÷ cores). 1 − cores·L ÷ (L + G), never below 0
    (G: the generators' core-seconds, L: the learner's)."""
    total = learner_busy_s + generation_s
    return max(0.0, 1.0 - cores * learner_busy_s / total) if total > 0 else 0.0


def window_wait_floor(run_dir: Path, start: dict, window: list[dict], cores: int) -> float:
    """``wait_floor`` over a ``learner_window``: the learner's busy seconds (the window less
    its waits) against the generators' (``generators_busy_share`` of the window, plus the
    spares' CPU seconds) on ``cores`` cores. The learner's idle share above it is the split's
    doing (cores that follow the work can take it back); the floor itself is the work's: no
    split removes it, only a faster generator, a slower learner or more cores."""
    t0, t1 = start["time"], window[-1]["time"]
    elapsed = t1 - t0
    learner = elapsed - sum(r["time/wait_data_s"] for r in window)
    generation = generators_busy_share(run_dir, t0, t1) * elapsed + spare_cpu_s(run_dir, t0, t1)
    return wait_floor(learner, generation, cores)


def collapsed_steps(run_dir: Path) -> list[int]:
    """The learner steps of a run flagged ``alert/sampled_drop`` (alerts.py: the sampled
    accuracy fell far below its best): a throughput figure over them measures dynamic sampling
    refilling after a policy collapse, not the steady state."""
    return [
        int(r["step"])
        for r in read_metrics(run_dir, "learner")
        if r.get("alert/sampled_drop") and "step" in r
    ]


def heldout_curve(run_dir: Path) -> list[tuple[int, float]]:
    """Every held-out evaluation of a run as (step, accuracy), in step order: the learner's own
    (before and after training, and periodic ones with ``learner.eval_process=false``) and the
    evaluator role's (periodic ones on weight snapshots, the default). Where both evaluated one
    step, the learner's figure counts."""
    by_step: dict[int, float] = {}
    for role in ("learner", "evaluator"):
        for r in read_metrics(run_dir, role):
            if "eval/accuracy" in r and "step" in r:
                by_step.setdefault(int(r["step"]), float(r["eval/accuracy"]))
    return sorted(by_step.items())
