"""Supervision of a run's role processes: start in order, watch, restart, stop.

    start: buffer ─(endpoint file)─► learner ─(wsync endpoint, dist mode)─► generators
    watch, every WATCH_PERIOD_S until the learner exits 0 (then drain: the evaluator's last
    evaluations, before it exits by itself):
        a role exited? ── may it come back? ── no ──► RuntimeError (its log tail; the run ends)
                                │ yes
                                ▼
        RestartPolicy: wait 1 s, 2 s, 4 s … (≤ BACKOFF_MAX_S); more than launch.max_restarts
        deaths within launch.restart_window_s ──► RuntimeError
                                ▼
        kill what is left of its process group, prepare (learner: --resume from its latest
        checkpoint; stale weight-sync endpoint removed), start it again

What comes back: a generator (launch.allow_generator_restarts); the buffer from its write-ahead
log on the same port, so peers reconnect by themselves (launch.restart_roles, buffer.wal); the
learner from its latest checkpoint, publishing those weights before its first step
(launch.restart_roles). A role that exits with an error within MIN_UPTIME_S of starting is not
restarted: that is a configuration or code error, and its log says which.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from dapo_async.tracking import read_metrics

# Supervision period; the status line is refreshed every TICK_S.
WATCH_PERIOD_S = 0.2
TICK_S = 1.0
# Without a terminal (logs, CI, benches) the status line is printed as a new line this often.
LOG_STATUS_EVERY_S = 10.0
# Lines of a failed role's log shown to the user.
LOG_TAIL_LINES = 30
# Restart backoff: first wait, doubled per recent restart, capped (a crash loop costs little CPU
# but an OOM-killed learner gets time for memory to free).
BACKOFF_BASE_S = 1.0
BACKOFF_MAX_S = 30.0
# An error exit this soon after starting is not retried (bad config, missing file, bug at start).
MIN_UPTIME_S = 20.0
# After the learner's last step, the evaluator's queue (a few snapshots, the final one) gets
# this long to drain: minutes on a real model, seconds on the tiny one.
DRAIN_TIMEOUT_S = 1800.0


class RestartPolicy:
    """Exponential backoff and a rate limit: at most ``max_restarts`` within ``window_s``.
    Restarts older than the window are forgotten, so a long run survives any number of
    spaced-out crashes while a crash loop stops the run."""

    def __init__(self, max_restarts: int, window_s: float):
        self.max_restarts, self.window_s = max_restarts, window_s
        self.recent: deque[float] = deque()

    def next_delay(self, now: float) -> float | None:
        """Seconds to wait before the next start, or None when the rate limit is exceeded."""
        while self.recent and now - self.recent[0] > self.window_s:
            self.recent.popleft()
        if len(self.recent) >= self.max_restarts:
            return None
        delay = min(BACKOFF_MAX_S, BACKOFF_BASE_S * 2 ** len(self.recent))
        self.recent.append(now)
        return delay


@dataclass(eq=False)
class Role:
    """One supervised process (group). ``restartable``: whether it may come back after dying;
    ``prepare``: called before every restart (may change ``cmd``)."""

    name: str
    cmd: list[str]
    log_path: Path
    env: dict
    restartable: bool = False
    prepare: Callable[[Role], None] | None = None
    proc: subprocess.Popen | None = field(default=None, init=False)
    restarts: int = field(default=0, init=False)
    started_at: float = field(default=0.0, init=False)
    restart_at: float | None = field(default=None, init=False)  # scheduled restart (backoff)

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            self.cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=self.env,
            start_new_session=True,
        )
        log.close()
        self.started_at = time.monotonic()
        self.restart_at = None

    def poll(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass

    def kill_group(self) -> None:
        """SIGKILL the whole process group (also children that outlived the leader)."""
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def tail(self, n: int = LOG_TAIL_LINES) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"


def stop_all(roles: list[Role], timeout_s: float) -> None:
    for r in roles:
        r.signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(r.poll() is None for r in roles):
        time.sleep(0.1)
    for r in roles:
        r.kill_group()
        if r.proc is not None:
            try:
                r.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass


def wait_for_endpoint(run_dir: Path, name: str, role: Role, interrupted: list) -> None:
    """Block until ``role`` publishes endpoint ``name``; fail if it dies first."""
    while not (run_dir / "endpoints" / name).exists():
        if role.poll() is not None:
            raise RuntimeError(
                f"{role.name} exited with {role.poll()} before serving {name}:\n{role.tail()}"
            )
        if interrupted:
            raise KeyboardInterrupt
        time.sleep(0.1)


def status_line(run_dir: Path, t0: float, num_steps: int) -> str:
    rows = [r for r in read_metrics(run_dir, "learner") if "rollout/reward_mean" in r]
    if not rows:
        return f"[train {time.monotonic() - t0:5.0f}s] waiting for the first step…"
    m = rows[-1]
    alerts = [k.removeprefix("alert/") for k, v in m.items() if k.startswith("alert/") and v]
    return (
        f"{'⚠ ' + ' '.join(alerts) + ' ' if alerts else ''}"  # dapo_async/alerts.py
        f"[train {time.monotonic() - t0:5.0f}s] step {int(m['step'])}/{num_steps} "
        f"sampled-acc {m.get('rollout/sampled_accuracy', float('nan')):.3f} "
        f"trained-acc {m['rollout/trained_accuracy']:.3f} "
        f"len {m['rollout/response_len_mean']:.1f} stale {m['staleness/mean']:.2f} "
        f"samples/s {m.get('learner/samples_per_s', 0):.1f} learner-idle {m.get('learner/idle_ratio', 0):.2f}"
    )


class Supervisor:
    """Starts the roles in order and watches them until the learner finishes (see the module
    docstring); ``interrupted`` collects SIGINT/SIGTERM from the signal handlers."""

    def __init__(
        self,
        cfg,
        run_dir: Path,
        buffer: Role,
        learner: Role,
        gens: list[Role],
        services: list[Role] | None = None,
        extras: list[Role] | None = None,
    ):
        self.cfg, self.run_dir = cfg, run_dir
        self.buffer, self.learner, self.gens = buffer, learner, gens
        # started after the buffer, before the learner, each waited for by its endpoint file
        # named like the role (the reward-model server: "reward")
        self.services = list(services or [])
        self.extras = list(extras or [])  # started last, nothing waits for them (the evaluator)
        lc = cfg.launch
        self.policies = {
            r.name: RestartPolicy(lc.max_restarts, lc.restart_window_s) for r in self.roles
        }
        self.interrupted: list[int] = []
        self.t0 = time.monotonic()
        self.t0_wall = time.time()  # metrics rows carry wall time: start-up is measured in it
        self.last_status = self.last_logged = 0.0

    @property
    def roles(self) -> list[Role]:
        return [self.buffer, *self.services, self.learner, *self.gens, *self.extras]

    def start(self) -> None:
        self.buffer.start()
        wait_for_endpoint(self.run_dir, "buffer", self.buffer, self.interrupted)
        for s in self.services:
            s.start()
            wait_for_endpoint(self.run_dir, s.name, s, self.interrupted)
        self.learner.start()
        if self.cfg.weight_sync.mode == "dist":
            wait_for_endpoint(self.run_dir, "wsync", self.learner, self.interrupted)
        for g in (*self.gens, *self.extras):
            g.start()

    def watch(self) -> None:
        """Until the learner exits 0; raises RuntimeError when a role fails for good and
        KeyboardInterrupt on a signal."""
        while True:
            if self.interrupted:
                raise KeyboardInterrupt
            if self.learner.restart_at is None and self.learner.poll() == 0:
                break
            now = time.monotonic()
            # the evaluator's 0 is its end even here: it may see the learner's last step and
            # exit before the learner does, and a restart would then wait minutes for work
            self._tend([r for r in self.roles if r not in self.extras], now, finished=())
            self._tend(self.extras, now, finished=(0,))
            self._status()
            time.sleep(WATCH_PERIOD_S)
        if sys.stderr.isatty():
            print(file=sys.stderr)

    def drain(self, timeout_s: float = DRAIN_TIMEOUT_S) -> None:
        """After the learner: the extras (the evaluator) finish their queued work and exit by
        themselves; one that dies is restarted as during the run. Raises KeyboardInterrupt on
        a signal; past ``timeout_s`` it stops waiting (the caller stops them)."""
        if not self.extras:
            return
        print("[train] learner finished; waiting for the last evaluations…", file=sys.stderr)
        deadline = time.monotonic() + timeout_s
        while any(r.poll() is None or r.restart_at is not None for r in self.extras):
            if self.interrupted:
                raise KeyboardInterrupt
            now = time.monotonic()
            if now > deadline:
                print(f"[train] still evaluating after {timeout_s:.0f}s: stopping", file=sys.stderr)
                return
            self._tend(self.extras, now, finished=(0,))
            time.sleep(WATCH_PERIOD_S)

    def _tend(self, roles: list[Role], now: float, finished: tuple[int, ...]) -> None:
        """Start again the roles whose backoff is over; schedule a restart for those that
        exited with a code not in ``finished`` (during the run every exit is a death; while
        draining, the evaluator's 0 is its end)."""
        for role in roles:
            if role.restart_at is not None:
                if now >= role.restart_at:
                    self._start_again(role)
            elif (code := role.poll()) is not None and code not in finished:
                self._schedule_restart(role, now)

    def _schedule_restart(self, role: Role, now: float) -> None:
        code = role.poll()
        if not role.restartable:
            raise RuntimeError(f"{role.name} exited with {code}:\n{role.tail()}")
        if code is not None and code > 0 and now - role.started_at < MIN_UPTIME_S:
            raise RuntimeError(
                f"{role.name} failed {now - role.started_at:.0f}s after starting (exit {code}); "
                f"not restarting a role that cannot start:\n{role.tail()}"
            )
        delay = self.policies[role.name].next_delay(now)
        if delay is None:
            lc = self.cfg.launch
            raise RuntimeError(
                f"{role.name} died more than {lc.max_restarts} times within "
                f"{lc.restart_window_s:.0f}s (launch.max_restarts, launch.restart_window_s); "
                f"giving up:\n{role.tail()}"
            )
        role.restarts += 1
        role.restart_at = now + delay
        print(
            f"\n[train] {role.name} exited with {code}; restarting in {delay:.0f}s "
            f"(restart {role.restarts})",
            file=sys.stderr,
            flush=True,
        )

    def _start_again(self, role: Role) -> None:
        role.kill_group()  # children that outlived the leader (engine cores, reward workers)
        if role.proc is not None:
            role.proc.wait()
        if role.prepare is not None:
            role.prepare(role)
        role.start()

    def _status(self) -> None:
        now = time.monotonic()
        if now - self.last_status < TICK_S:
            return
        self.last_status = now
        line = status_line(self.run_dir, self.t0, self.cfg.learner.num_steps)
        if sys.stderr.isatty():
            print("\r" + line[:150].ljust(150), end="", file=sys.stderr, flush=True)
        elif now - self.last_logged >= LOG_STATUS_EVERY_S:
            self.last_logged = now
            print(line, file=sys.stderr, flush=True)
