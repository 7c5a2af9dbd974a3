"""`dapo-async supervise -- COMMAND` (launch/keep_running.py), the restart loop of the Slurm
template, with real child processes: a finished command ends it, a killed one comes back, an
error at start-up is not retried, a crash loop gives up, and SIGTERM stops the child's group."""

import os
import signal
import subprocess
import sys
import time

SUPERVISE = [sys.executable, "-m", "dapo_async.cli", "supervise", "--name", "t"]


def _run(*args, timeout=60):
    return subprocess.run([*SUPERVISE, *args], capture_output=True, text=True, timeout=timeout)


def test_a_finished_command_ends_it_and_an_early_error_is_not_retried():
    done = _run("--", "bash", "-c", "exit 0")
    assert done.returncode == 0 and "[supervise t] finished" in done.stderr
    bad = _run("--", "bash", "-c", "exit 3")  # within --min-uptime-s: a config error
    assert bad.returncode == 3 and "not retried" in bad.stderr
    assert bad.stderr.count("started pid") == 1


def test_a_crash_loop_gives_up_after_max_restarts(tmp_path):
    out = _run("--min-uptime-s", "0", "--max-restarts", "2", "--", "bash", "-c", "exit 4")
    assert out.returncode == 4 and out.stderr.count("started pid") == 3
    assert "died more than 2 times" in out.stderr


def _alive(pid: int) -> bool:
    """Running (a zombie no one has reaped yet is not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_killed_child_comes_back_and_sigterm_stops_its_group(tmp_path):
    marker = tmp_path / "grandchild.pid"
    # the child leaves a grandchild in its group: stopping must take both
    script = f"sleep 300 & echo $! > {marker}; wait"
    proc = subprocess.Popen(
        [*SUPERVISE, "--grace-s", "5", "--", "bash", "-c", script],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stderr.readline()
        assert "started pid" in line and "(start 1)" in line
        child = int(line.split("pid ")[1].split()[0])
        deadline = time.monotonic() + 30
        while not (marker.exists() and marker.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.1)
        first = int(marker.read_text())
        os.kill(child, signal.SIGKILL)  # a signal death: always restarted
        assert "exited with -9" in proc.stderr.readline()
        second = proc.stderr.readline()
        assert "(start 2)" in second
        assert not _alive(first)  # what the dead child left in its group went with it
        deadline = time.monotonic() + 30
        while marker.read_text().strip() in ("", str(first)) and time.monotonic() < deadline:
            time.sleep(0.1)  # the second start's grandchild
        grandchild = int(marker.read_text())
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
        assert not _alive(grandchild)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_config_show_get_prints_resolved_values(repo, cli_env):
    out = subprocess.run(
        [sys.executable, "-m", "dapo_async.cli", "config", "show", "configs/tiny_cpu.yaml",
         "learner.eval_every=4", "--get", "learner.eval_every", "--get", "learner.eval_process"],
        capture_output=True, text=True, cwd=repo, env=cli_env, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0 and out.stdout.split() == ["4", "true"]
    bad = subprocess.run(
        [sys.executable, "-m", "dapo_async.cli", "config", "show", "configs/tiny_cpu.yaml",
         "--get", "learner"],
        capture_output=True, text=True, cwd=repo, env=cli_env, timeout=60,
    )  # fmt: skip
    assert bad.returncode == 1 and "is a section" in bad.stderr
