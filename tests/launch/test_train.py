"""The launcher and the roles started by hand, end to end over 127.0.0.1 (real processes)."""

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

FAST = [
    "learner.num_steps=4",
    "buffer.groups_per_step=4",
    "generator.prompts_per_batch=4",
    "generator.responses_per_prompt=4",
    "data.num_eval=16",
    "tracking.aim=false",
    "buffer.dynamic_sampling=false",
    "launch.shutdown_timeout_s=10",
]


def train_cmd(tiny_model, run_dir, *extra):
    return [
        sys.executable,
        "-m",
        "dapo_async.cli",
        "train",
        "configs/tiny_cpu.yaml",
        f"model.path={tiny_model}",
        f"run_dir={run_dir}",
        *FAST,
        *extra,
    ]


def stop_launcher(proc):
    """Cleanup after a test: SIGINT lets the launcher stop its roles; kill only if it hangs."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=40)
        except subprocess.TimeoutExpired:
            proc.kill()


def descendants_alive(pids):
    alive = []
    for pid in pids:
        try:
            p = psutil.Process(pid)
            if p.status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


@pytest.mark.slow
def test_train_runs_to_completion(tiny_model, tmp_path, repo, cli_env):
    out = subprocess.run(
        train_cmd(tiny_model, tmp_path / "run", "--json"),
        capture_output=True,
        text=True,
        cwd=repo,
        env=cli_env,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 4
    assert (
        summary["heldout_accuracy_before"] is not None
        and summary["heldout_accuracy_after"] is not None
    )
    assert (tmp_path / "run" / "config.yaml").exists()
    assert list((tmp_path / "run" / "checkpoints").glob("step-*"))


def _start_and_wait_for_training(tiny_model, tmp_path, repo, cli_env):
    proc = subprocess.Popen(
        train_cmd(tiny_model, tmp_path / "run", "learner.num_steps=1000"),
        cwd=repo,
        env=cli_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        kids = psutil.Process(proc.pid).children(recursive=True)
        if (tmp_path / "run" / "metrics" / "learner.jsonl").exists() and len(kids) >= 3:
            break
        time.sleep(0.5)
    return proc, [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]


def test_sigkill_of_launcher_orphans_nothing(tiny_model, tmp_path, repo, cli_env):
    proc, pids = _start_and_wait_for_training(tiny_model, tmp_path, repo, cli_env)
    assert len(pids) >= 3
    t0 = time.monotonic()
    proc.kill()  # no cleanup in the launcher: the roles must notice by themselves
    proc.wait()
    while descendants_alive(pids) and time.monotonic() - t0 < 30:
        time.sleep(0.5)
    assert descendants_alive(pids) == []


def test_sigint_leaves_no_process(tiny_model, tmp_path, repo, cli_env):
    proc, pids = _start_and_wait_for_training(tiny_model, tmp_path, repo, cli_env)
    try:
        assert len(pids) >= 3
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=40)
        assert proc.returncode == 130
        while descendants_alive(pids) and time.monotonic() - t0 < 30:
            time.sleep(0.5)
        assert descendants_alive(pids) == []
        assert time.monotonic() - t0 < 30
    finally:
        stop_launcher(proc)


@pytest.mark.slow
def test_killed_generator_is_restarted_and_run_finishes(tiny_model, tmp_path, repo, cli_env):
    run = tmp_path / "run"
    proc = subprocess.Popen(
        train_cmd(tiny_model, run, "learner.num_steps=12", "--json"),
        cwd=repo,
        env=cli_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 180
        killed = False
        while time.monotonic() < deadline and not killed:
            rows = (
                (run / "metrics" / "learner.jsonl").read_text().splitlines()
                if (run / "metrics" / "learner.jsonl").exists()
                else []
            )
            if len(rows) >= 3:
                for p in psutil.Process(proc.pid).children(recursive=True):
                    if "generator" in p.cmdline()[3:4]:  # the role argument, not a path
                        os.kill(p.pid, signal.SIGKILL)
                        killed = True
            time.sleep(0.3)
        assert killed
        out, err = proc.communicate(timeout=400)
    finally:
        stop_launcher(proc)
    assert proc.returncode == 0, err[-3000:]
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["steps"] == 12 and summary["generator_restarts"] >= 1


@pytest.mark.slow
def test_roles_started_separately(tiny_model, tmp_path, repo, cli_env):
    """As on separate hosts: buffer, learner and two generators by their own commands."""
    import yaml

    run = tmp_path / "run"
    cfg = {"name": "sep", "run_dir": str(run), "model": {"path": str(tiny_model)}}
    for item in FAST + ["learner.num_steps=5"]:
        key, val = item.split("=")
        sec, k = key.split(".")
        cfg.setdefault(sec, {})[k] = yaml.safe_load(val)
    base = yaml.safe_load((repo / "configs" / "tiny_cpu.yaml").read_text())
    for sec, vals in cfg.items():
        if isinstance(vals, dict):
            base.setdefault(sec, {}).update(vals)
        else:
            base[sec] = vals
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(base))
    cli = [sys.executable, "-m", "dapo_async.cli"]
    logs = [open(tmp_path / f"{n}.log", "w") for n in ("buffer", "learner", "g1", "g2")]
    procs = [
        subprocess.Popen(
            cli + ["buffer", str(path)],
            cwd=repo,
            env=cli_env,
            stdout=logs[0],
            stderr=subprocess.STDOUT,
        )
    ]
    try:
        procs.append(
            subprocess.Popen(
                cli + ["learner", str(path)],
                cwd=repo,
                env=cli_env,
                stdout=logs[1],
                stderr=subprocess.STDOUT,
            )
        )
        deadline = time.monotonic() + 120
        while not (run / "endpoints" / "wsync").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        for i, lg in ((1, logs[2]), (2, logs[3])):
            procs.append(
                subprocess.Popen(
                    cli + ["generator", str(path), "--id", f"g{i}"],
                    cwd=repo,
                    env=cli_env,
                    stdout=lg,
                    stderr=subprocess.STDOUT,
                )
            )
        assert procs[1].wait(timeout=400) == 0, (tmp_path / "learner.log").read_text()[-3000:]
    finally:
        for p in procs[2:] + procs[:1]:
            p.send_signal(signal.SIGINT)
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
    rows = [
        json.loads(line) for line in (run / "metrics" / "learner.jsonl").read_text().splitlines()
    ]
    steps = [r["step"] for r in rows if "rollout/reward_mean" in r]
    assert steps == [1, 2, 3, 4, 5]
    final = json.loads((run / "buffer_final.json").read_text())
    assert final["counters"]["produced"] >= 5 * 4
