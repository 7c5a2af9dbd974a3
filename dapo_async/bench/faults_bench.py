"""`dapo-async bench faults`: what a SIGKILL costs a running job, measured on real runs.

Four runs of the main job with the launcher (`dapo-async train`), roles killed from outside:

- ``generators``: 40 steps with two generators, a random generator SIGKILLed at steps 5, 10, …,
  30 (six kills): ``generator_kills_max_wait_s`` = the learner's longest wait for a batch;
- ``buffer``: the buffer SIGKILLed after step 10: ``buffer_kill_stall_s`` = the longest time
  between two learner steps (the buffer's restart, WAL replay and the peers' reconnection);
- ``learner``: the learner SIGKILLed after step 10 (checkpoints every 5 steps):
  ``learner_kill_stall_s`` = the longest time between two recorded steps (restart, model load,
  resume, the steps since the checkpoint trained again).

- ``wsync``: ``weight_sync.mode=dist``, two generators, a generator SIGKILLed twice in each
  phase of weight sync — ``formation`` (as a new epoch is announced: the group forms with the
  generator restarted after the previous kill), ``after_publish`` (a round on the wire),
  ``between`` (a random moment) — ``wsync_max_gap_s``: per phase, the longest time between two
  learner steps after such a kill.

Each also reports ``*_median_step_s`` (the normal step interval) and whether the run finished.
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from dapo_async.bench.common import print_result
from dapo_async.tracking import read_metrics

# Longest a scenario may take before it counts as hung.
RUN_TIMEOUT_S = 900.0
# How often the weight-sync scenario looks at the run's logs and metrics.
WATCH_S = 0.05
# Generators of the weight-sync scenario.
WSYNC_GENERATORS = 2


def _steps(run_dir: Path) -> list[dict]:
    return [r for r in read_metrics(run_dir, "learner") if "time/wait_data_s" in r]


def role_processes(launcher_pid: int, role: str) -> list[psutil.Process]:
    """The leader processes of ``role`` (buffer, learner, generator) under a launcher."""
    out = []
    for p in psutil.Process(launcher_pid).children():
        try:
            if role in p.cmdline()[3:4]:  # python -m dapo_async.cli ROLE ...
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def _kill(launcher: subprocess.Popen, role: str, rng: random.Random) -> bool:
    kids = role_processes(launcher.pid, role)
    if not kids:
        return False
    os.kill(rng.choice(kids).pid, signal.SIGKILL)
    return True


def run_scenario(config: str, overrides: list[str], run_dir: Path, role: str, at: list[int]):
    """Train with ``role`` SIGKILLed once the learner recorded each step in ``at``."""
    cmd = [sys.executable, "-m", "dapo_async.cli", "train", config, f"run_dir={run_dir}"]
    proc = subprocess.Popen([*cmd, *overrides], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    rng, kills = random.Random(0), 0
    deadline = time.monotonic() + RUN_TIMEOUT_S
    try:
        for step in at:
            while len(_steps(run_dir)) < step and proc.poll() is None:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"bench faults: {role} scenario hung")
                time.sleep(0.2)
            while proc.poll() is None and not _kill(proc, role, rng):
                time.sleep(0.2)  # the role is restarting: wait for it
            kills += 1
        _, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=60)
    steps = _steps(run_dir)
    times = [r["time"] for r in steps]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    return {
        "finished": proc.returncode == 0,
        "kills": kills,
        "steps": len({r["step"] for r in steps}),
        "max_wait_s": max(r["time/wait_data_s"] for r in steps),
        "max_gap_s": max(gaps),
        "median_step_s": statistics.median(gaps),
        "stderr_tail": "" if proc.returncode == 0 else err.decode()[-1500:],
    }


def _full_epochs(run_dir: Path) -> int:
    """Weight-sync epochs announced so far with every generator in them (group formations
    with all members: the first one, and each with a restarted generator rejoining)."""
    log = run_dir / "logs" / "learner.log"
    if not log.exists():
        return 0
    return log.read_text().count(f"with {WSYNC_GENERATORS} receivers")


def _wait(cond, proc: subprocess.Popen, deadline: float, what: str) -> None:
    while not cond():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(
                f"bench faults: the weight-sync run ended or hung waiting for {what}"
            )
        time.sleep(WATCH_S)


def _kill_in_phase(proc, run_dir: Path, phase: str, rng, deadline: float, full: int) -> float:
    """SIGKILL a generator in ``phase`` of weight sync; returns the kill's wall time.
    ``formation``: the moment the group is formed again with every generator (the one killed
    last, restarted, rejoining: ``full`` full epochs had been announced at that kill);
    ``after_publish``: as a step is recorded (its weights just published: the round is on the
    wire); ``between``: a random moment within the next step."""
    if phase == "formation":
        _wait(lambda: _full_epochs(run_dir) > full, proc, deadline, "the group re-formed")
    elif phase == "after_publish":
        seen = len(_steps(run_dir))
        _wait(lambda: len(_steps(run_dir)) > seen, proc, deadline, "the next step")
    else:
        time.sleep(rng.uniform(0.0, 1.0))
    _wait(lambda: _kill(proc, "generator", rng), proc, deadline, "a live generator")
    return time.time()


def run_wsync_phases(config: str, overrides: list[str], run_dir: Path, rounds: int = 2) -> dict:
    """``weight_sync.mode=dist`` with two generators: a generator SIGKILLed ``rounds`` times in
    each phase of weight sync; the longest gap between learner steps after a kill, per phase
    (until the next kill)."""
    order = ["between", "formation", "after_publish", "formation"] * rounds
    extra = ["weight_sync.mode=dist", f"generator.num_generators={WSYNC_GENERATORS}",
             f"learner.num_steps={10 + 8 * len(order)}"]  # fmt: skip
    cmd = [sys.executable, "-m", "dapo_async.cli", "train", config, f"run_dir={run_dir}"]
    proc = subprocess.Popen([*cmd, *overrides, *extra], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)  # fmt: skip
    rng, kills, full = random.Random(1), [], 0
    deadline = time.monotonic() + RUN_TIMEOUT_S
    try:
        for phase in order:
            if phase != "formation":  # a few normal steps first (formation follows a kill)
                at = len(_steps(run_dir)) + 3
                _wait(lambda a=at: len(_steps(run_dir)) >= a, proc, deadline, f"step {at}")
            full = _full_epochs(run_dir) if phase != "formation" else full
            kills.append((phase, _kill_in_phase(proc, run_dir, phase, rng, deadline, full)))
            full = _full_epochs(run_dir)
        _, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=60)
    return _phase_gaps(run_dir, kills) | {"finished": proc.returncode == 0, "kills": len(kills)}


def _phase_gaps(run_dir: Path, kills: list[tuple[str, float]]) -> dict:
    times = [r["time"] for r in _steps(run_dir)]
    worst: dict[str, float] = {}
    for (phase, t), nxt in zip(kills, [*[t for _, t in kills[1:]], float("inf")]):
        gaps = [b - a for a, b in itertools.pairwise(times) if b > t and a < nxt]
        worst[phase] = max(worst.get(phase, 0.0), max(gaps, default=0.0))
    gaps = [b - a for a, b in itertools.pairwise(times)]
    return {"max_gap_s": worst, "median_step_s": statistics.median(gaps) if gaps else 0.0}


SCENARIOS = ("generators", "buffer", "learner", "wsync")


def _scenarios(args, root: Path) -> dict:
    """Run the scenarios named in ``args.only`` (all by default); their figures, flat."""
    base = ["tracking.aim=false", "learner.checkpoint_every=5", *args.overrides]
    only = set(args.only.split(",")) if args.only else set(SCENARIOS)
    if only - set(SCENARIOS):
        raise SystemExit(f"bench faults --only: {sorted(only - set(SCENARIOS))} not in {SCENARIOS}")
    out, failed = {}, {}
    if "generators" in only:
        r = run_scenario(args.config, [*base, "learner.num_steps=40", "generator.num_generators=2"],
                         root / "generators", "generator", [5, 10, 15, 20, 25, 30])  # fmt: skip
        out |= {"generator_kills": r["kills"], "generator_kills_finished": r["finished"],
                "generator_kills_max_wait_s": r["max_wait_s"],
                "generator_kills_median_step_s": r["median_step_s"]}  # fmt: skip
        failed["generators"] = r["stderr_tail"]
    for role in ("buffer", "learner"):
        if role in only:
            r = run_scenario(args.config, [*base, "learner.num_steps=20"], root / role, role, [10])
            out |= {f"{role}_kill_finished": r["finished"], f"{role}_kill_stall_s": r["max_gap_s"],
                    f"{role}_kill_median_step_s": r["median_step_s"]}  # fmt: skip
            failed[role] = r["stderr_tail"]
    if "wsync" in only:
        r = run_wsync_phases(args.config, base, root / "wsync")
        out |= {"wsync_kills": r["kills"], "wsync_finished": r["finished"],
                "wsync_max_gap_s": r["max_gap_s"], "wsync_median_step_s": r["median_step_s"]}  # fmt: skip
    for name, tail in failed.items():
        if tail:
            print(f"[bench faults] {name} run failed:\n{tail}", file=sys.stderr)
    return out


def _summary(out: dict) -> str:
    parts = []
    if "generator_kills" in out:
        parts.append(f"{out['generator_kills']} generator kills in 40 steps: longest batch wait "
                     f"{out['generator_kills_max_wait_s']:.1f}s "
                     f"(finished {out['generator_kills_finished']})")  # fmt: skip
    for role in ("buffer", "learner"):
        if f"{role}_kill_stall_s" in out:
            parts.append(f"{role} kill: stall {out[f'{role}_kill_stall_s']:.1f}s "
                         f"(finished {out[f'{role}_kill_finished']})")  # fmt: skip
    if "wsync_max_gap_s" in out:
        gaps = ", ".join(f"{k} {v:.1f}s" for k, v in out["wsync_max_gap_s"].items())
        parts.append(f"weight-sync (dist) kills, longest step gap per phase: {gaps} "
                     f"(normal step {out['wsync_median_step_s']:.1f}s, "
                     f"finished {out['wsync_finished']})")  # fmt: skip
    return "; ".join(parts)


def main(args: argparse.Namespace) -> int:
    root = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="dapo-bench-faults-"))
    out = _scenarios(args, root) | {"run_root": str(root)}
    return print_result(_summary(out), out, args.json)
