"""`dapo-async supervise [options] -- COMMAND...`: keep one role's command running on a node
where `dapo-async train` does not run — a Slurm task, a node of a hand-made cluster
(``tools/slurm/``) — with the same restart rules as `train`'s supervisor (``supervisor.py``).

    start COMMAND (its own process group, output to ours: the task's log)
    COMMAND exits ── 0 ─────────────────────────────► exit 0 (the role finished)
         │ error, or killed by a signal
         ▼
    an error exit within --min-uptime-s of starting ──► exit with it (a config error, a bug)
    more than --max-restarts deaths within --window-s ► exit with it (a crash loop)
         │ else
         ▼
    wait (RestartPolicy backoff), kill what is left of its group, start it again
    SIGTERM / SIGINT to us ──► SIGTERM to its group, SIGKILL after --grace-s, exit 128 + signal

Each start prints ``[supervise NAME] started pid P (start N)``: the process to signal, and
the count a test or an operator checks. A death by a signal (SIGKILL, the OOM killer) is
always restarted: it says nothing about the configuration.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

from dapo_async.launch.supervisor import MIN_UPTIME_S, RestartPolicy

# How often the loop looks at its child and at signals received.
POLL_S = 0.2
# Grace between SIGTERM and SIGKILL on shutdown: roles flush and close in a few seconds, and
# every process must be gone within 30 s of Ctrl-C.
GRACE_S = 20.0


def add_parser(sub) -> None:
    p = sub.add_parser(
        "supervise",
        help="keep one role's command running (restart with backoff), for Slurm or hand-made "
        "clusters: `dapo-async supervise --name gen0 -- dapo-async generator CONFIG`",
    )
    p.add_argument("--name", default="role", help="name in this wrapper's lines")
    p.add_argument("--max-restarts", type=int, default=10, help="within --window-s; more: give up")
    p.add_argument("--window-s", type=float, default=600.0, help="window of --max-restarts")
    p.add_argument(
        "--min-uptime-s",
        type=float,
        default=MIN_UPTIME_S,
        help="an error exit sooner than this after starting is not retried",
    )
    p.add_argument("--grace-s", type=float, default=GRACE_S, help="SIGTERM → SIGKILL on stop")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- COMMAND ARGS...")
    p.set_defaults(func=main)


def _say(name: str, line: str) -> None:
    print(f"[supervise {name}] {line}", file=sys.stderr, flush=True)


def _stop(proc: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM the child's group, SIGKILL it after ``grace_s`` (children that outlived it too)."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue
        if sig == signal.SIGTERM:  # the leader is gone: clear what it left behind
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return


def main(args: argparse.Namespace) -> int:
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        from dapo_async.cli import CliError

        raise CliError("supervise needs a command after `--`")
    received: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: received.append(signum))
    policy = RestartPolicy(args.max_restarts, args.window_s)
    starts = 0
    while True:
        starts += 1
        started = time.monotonic()
        try:
            proc = subprocess.Popen(cmd, start_new_session=True, stdin=subprocess.DEVNULL)
        except OSError as e:
            _say(args.name, f"cannot start {cmd[0]!r}: {e}")
            return 127
        _say(args.name, f"started pid {proc.pid} (start {starts})")
        while proc.poll() is None and not received:
            time.sleep(POLL_S)
        if received:
            _stop(proc, args.grace_s)
            _say(args.name, f"stopped (signal {received[0]})")
            return 128 + received[0]
        code = proc.returncode
        try:  # children the leader left (engine cores, reward workers)
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if code == 0:
            _say(args.name, "finished")
            return 0
        now = time.monotonic()
        if code > 0 and now - started < args.min_uptime_s:
            _say(args.name, f"exited with {code} {now - started:.0f}s after starting: not retried")
            return code
        delay = policy.next_delay(now)
        if delay is None:
            _say(args.name, f"died more than {args.max_restarts} times in {args.window_s:.0f}s")
            return code if code > 0 else 1
        _say(args.name, f"exited with {code}; restarting in {delay:.0f}s")
        deadline = time.monotonic() + delay
        while time.monotonic() < deadline and not received:
            time.sleep(POLL_S)
        if received:
            _say(args.name, f"stopped (signal {received[0]})")
            return 128 + received[0]
