"""Fault injection against a real run: start `dapo-async train`, find a role's process, kill it,
and check what the run left behind (the buffer's accounting and the learner's audit)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from testutil import TRAIN_FAST

from dapo_async.bench.faults_bench import role_processes

# A short main job with a checkpoint every 3 steps (the WAL is on by default).
FAST = [*TRAIN_FAST, "learner.checkpoint_every=3"]


def start_run(repo, env, tiny_model, run_dir: Path, *extra) -> subprocess.Popen:
    cmd = [
        sys.executable, "-m", "dapo_async.cli", "train", "configs/tiny_cpu.yaml",
        f"model.path={tiny_model}", f"run_dir={run_dir}", *FAST, *extra, "--json",
    ]  # fmt: skip
    return subprocess.Popen(
        cmd, cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def learner_steps(run_dir: Path) -> int:
    path = run_dir / "metrics" / "learner.jsonl"
    if not path.exists():
        return 0
    return sum(1 for line in path.read_text().splitlines() if "rollout/reward_mean" in line)


def wait_for(cond, timeout_s: float, what: str, proc=None) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert proc is None or proc.poll() is None, f"the run ended while waiting for {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def kill_role(launcher: subprocess.Popen, role: str) -> int:
    """SIGKILL the leader of every process of ``role``; returns how many were killed."""
    procs = role_processes(launcher.pid, role)
    for p in procs:
        os.kill(p.pid, signal.SIGKILL)
    return len(procs)


def finish(proc: subprocess.Popen, timeout_s: float = 600) -> dict:
    """Wait for the run; its --json summary (assert it succeeded)."""
    try:
        out, err = proc.communicate(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=40)
    assert proc.returncode == 0, err[-4000:]
    return json.loads(out.strip().splitlines()[-1]) | {"stderr": err}


def check_accounting(run_dir: Path, num_steps: int) -> None:
    """Every step trained once (after a learner restart the steps since its checkpoint are
    trained again, with the very same groups); no group id in two steps; the buffer's identity:
    produced = trained + dropped by reason + ready + assigned but not yet confirmed."""
    records = [json.loads(x) for x in (run_dir / "audit" / "trained-rank0.jsonl").open()]
    last: dict[int, dict] = {}
    for r in records:
        if r["step"] in last:
            assert r["groups"] == last[r["step"]]["groups"], f"step {r['step']} changed"
        last[r["step"]] = r
    assert sorted(last) == list(range(num_steps))
    ids = [g for r in last.values() for g in r["groups"]]
    assert len(ids) == len(set(ids)), "a group was trained twice"
    final = json.loads((run_dir / "buffer_final.json").read_text())
    c = final["counters"]
    held = final["ready"] + final["untrained_assigned"]
    assert c["produced"] == c["trained"] + sum(c["dropped"].values()) + held, final
    assert c["trained"] + final["untrained_assigned"] >= len(ids), final
