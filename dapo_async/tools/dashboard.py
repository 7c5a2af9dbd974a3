"""`dapo-async dashboard RUN_DIR`: serve the run's Aim repo with `aim up` until Ctrl-C.

`aim up` starts a uvicorn child that keeps the port if only its parent is stopped, so the
server runs in its own process group (session) and the whole group is stopped: SIGTERM, then
SIGKILL after ``STOP_GRACE_S``. The repo is indexed by `aim up` itself, so runs written by other
processes appear. Binds 127.0.0.1 unless ``--host`` says otherwise (the UI has no authentication:
reach it through an SSH tunnel rather than binding a public address).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

# `aim up` indexes the repo before serving; on a large repo that takes a while.
READY_TIMEOUT_S = 120.0
# Grace period between SIGTERM and SIGKILL of the server's process group.
STOP_GRACE_S = 10.0
POLL_S = 0.5


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/api/projects/", timeout=2) as r:
            return r.status == 200
    except Exception:
        return False


def stop_group(proc: subprocess.Popen, grace_s: float = STOP_GRACE_S) -> None:
    """Stop the server's whole process group: SIGTERM, then SIGKILL after ``grace_s``."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the uvicorn child may outlive its parent
    except ProcessLookupError:
        pass
    proc.wait()


def _repo_of(run_dir: Path) -> Path:
    """The project's Aim repo beside the run directory (older runs kept theirs inside)."""
    from dapo_async.tracking import default_repo

    own = run_dir / "aim"
    return own if (own / ".aim").is_dir() else Path(default_repo(run_dir))


def main(args: argparse.Namespace) -> int:
    repo = Path(args.repo) if args.repo else _repo_of(Path(args.run_dir))
    if not (repo / ".aim").is_dir():
        print(
            f"dapo-async dashboard: error: {repo} is not an Aim repo (no .aim folder); "
            "was the run started with tracking.aim=true?",
            file=sys.stderr,
        )
        return 1
    aim_bin = Path(sys.executable).with_name("aim")
    cmd = [
        str(aim_bin) if aim_bin.exists() else "aim",
        "up",
        "--repo",
        str(repo),
        "--host",
        args.host,
        "--port",
        str(args.port),
    ]
    proc = subprocess.Popen(cmd, start_new_session=True)
    stopping = []

    def on_signal(signum, frame):
        stopping.append(signum)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    url = f"http://{args.host}:{args.port}"
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not stopping and proc.poll() is None and not _ready(url):
            if time.monotonic() > deadline:
                print(f"dapo-async dashboard: error: no answer at {url}", file=sys.stderr)
                return 1
            time.sleep(POLL_S)
        if proc.poll() is not None:
            print(f"dapo-async dashboard: error: aim up exited {proc.returncode}", file=sys.stderr)
            return 1
        if not stopping:
            print(f"[dashboard] Aim UI at {url}  (repo {repo}; Ctrl-C to stop)", flush=True)
        while not stopping and proc.poll() is None:
            time.sleep(POLL_S)
    finally:
        stop_group(proc)
    print("[dashboard] stopped", flush=True)
    return 0
