"""`dapo-async train CONFIG [overrides]`: every role on one machine, supervised.

    launcher ─┬─ buffer           (1 process)
              ├─ learner          (1 process, or torchrun with learner.num_ranks ranks)
              └─ generator × N    (restarted if they die and launch.allow_generator_restarts)

Order: resolve config and run directory → build the tiny model if needed → start the buffer
(its endpoint file appears) → learner → generators → supervise (status line every second) →
when the learner finishes: SIGTERM to the rest, SIGKILL after launch.shutdown_timeout_s → summary.
Each child leads its own process group, so stopping a role stops everything it started.
A role that dies (other than a restartable generator) ends the run with its log tail and exit 1;
Ctrl-C stops everything and exits 130.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from dapo_async.checkpoint_dirs import latest
from dapo_async.config import load_config, save_resolved
from dapo_async.data.tasks import parse_source
from dapo_async.roles import LAUNCHER_PID_ENV
from dapo_async.tiny.build import WarmStartError, build
from dapo_async.tracking import read_metrics
from dapo_async.utils import free_port

# Supervision tick; also the status line period.
TICK_S = 1.0
# Without a terminal (logs, CI, benches) the status line is printed as a new line this often.
LOG_STATUS_EVERY_S = 10.0
# Lines of a failed role's log shown to the user.
LOG_TAIL_LINES = 30
# A generator that keeps dying is a bug, not bad luck: stop the run after this many restarts.
MAX_GENERATOR_RESTARTS = 5


class Role:
    def __init__(self, name: str, cmd: list[str], log_path: Path, env: dict):
        self.name = name
        self.cmd = cmd
        self.log_path = log_path
        self.env = env
        self.proc: subprocess.Popen | None = None
        self.restarts = 0

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


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "dapo_async.cli", *args]


def _new_run_dir(cfg) -> Path:
    if cfg.run_dir:
        return Path(cfg.run_dir)
    return Path("runs") / f"{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}"


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


def _wait_for_endpoint(run_dir: Path, name: str, role: Role, interrupted: list) -> None:
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
    return (
        f"[train {time.monotonic() - t0:5.0f}s] step {int(m['step'])}/{num_steps} "
        f"sampled-acc {m.get('rollout/sampled_accuracy', float('nan')):.3f} "
        f"trained-acc {m['rollout/trained_accuracy']:.3f} "
        f"len {m['rollout/response_len_mean']:.1f} stale {m['staleness/mean']:.2f} "
        f"samples/s {m.get('learner/samples_per_s', 0):.1f} learner-idle {m.get('learner/idle_ratio', 0):.2f}"
    )


def build_tiny_policy(cfg) -> dict:
    """Build or reuse the built-in tiny policy for this run's task (model.tiny_dir)."""
    print(f"[train] built-in tiny policy in {cfg.model.tiny_dir}", file=sys.stderr)
    family = parse_source(cfg.data.source)
    if family is None:  # a data file: the tiny policy keeps its default warm start
        return build(cfg.model.tiny_dir, seed=cfg.model.tiny_seed, log=_stderr)
    return build(
        cfg.model.tiny_dir,
        seed=cfg.model.tiny_seed,
        task=family,
        difficulty=cfg.data.difficulty,
        max_difficulty=cfg.data.max_difficulty,
        log=_stderr,
    )


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def prepare_run(cfg):
    """Resolve the run directory, build the tiny policy if needed, clear stale endpoints and
    write the resolved config; returns (cfg, run_dir, path of the resolved config)."""
    run_dir = _new_run_dir(cfg)
    cfg = replace(cfg, run_dir=str(run_dir))
    if not cfg.model.path:
        build_tiny_policy(cfg)
    (run_dir / "endpoints").mkdir(parents=True, exist_ok=True)
    for stale in (run_dir / "endpoints").iterdir():
        stale.unlink()
    return cfg, run_dir, save_resolved(cfg, run_dir)


def make_roles(cfg, cfg_path: Path, run_dir: Path, resume: bool) -> tuple[Role, Role, list[Role]]:
    """(buffer, learner, generators), not started; each logs to ``run_dir/logs/<name>.log``."""
    logs = run_dir / "logs"
    env = dict(
        os.environ,
        OMP_NUM_THREADS=str(cfg.launch.torch_threads),
        PYTHONUNBUFFERED="1",
        **{LAUNCHER_PID_ENV: str(os.getpid())},
    )
    buffer = Role("buffer", _cli("buffer", str(cfg_path)), logs / "buffer.log", env)
    learner_cmd = _cli("learner", str(cfg_path))
    if cfg.learner.num_ranks > 1:
        learner_cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={cfg.learner.num_ranks}",
            f"--master_port={free_port('127.0.0.1')}",
            *learner_cmd[1:],
        ]
    if resume:
        learner_cmd.append("--resume")
    learner = Role("learner", learner_cmd, logs / "learner.log", env)
    gens = [
        Role(
            f"gen{i}",
            _cli("generator", str(cfg_path), "--id", f"gen{i}"),
            logs / f"gen{i}.log",
            env,
        )
        for i in range(cfg.generator.num_generators)
    ]
    return buffer, learner, gens


class Supervisor:
    """Starts the roles in order and watches them until the learner finishes (see the module
    docstring); ``interrupted`` collects SIGINT/SIGTERM from the signal handlers."""

    def __init__(self, cfg, run_dir: Path, buffer: Role, learner: Role, gens: list[Role]):
        self.cfg, self.run_dir = cfg, run_dir
        self.buffer, self.learner, self.gens = buffer, learner, gens
        self.interrupted: list[int] = []
        self.t0 = time.monotonic()
        self.last_status = self.last_logged = 0.0

    def start(self) -> None:
        self.buffer.start()
        _wait_for_endpoint(self.run_dir, "buffer", self.buffer, self.interrupted)
        self.learner.start()
        if self.cfg.weight_sync.mode == "dist":
            _wait_for_endpoint(self.run_dir, "wsync", self.learner, self.interrupted)
        for g in self.gens:
            g.start()

    def watch(self) -> None:
        """Until the learner exits 0; raises RuntimeError when a role fails for good and
        KeyboardInterrupt on a signal."""
        while True:
            if self.interrupted:
                raise KeyboardInterrupt
            code = self.learner.poll()
            if code is not None:
                if code != 0:
                    raise RuntimeError(f"learner exited with {code}:\n{self.learner.tail()}")
                break
            if self.buffer.poll() is not None:
                raise RuntimeError(
                    f"buffer exited with {self.buffer.poll()}:\n{self.buffer.tail()}"
                )
            for g in self.gens:
                if g.poll() is not None:
                    self._restart(g)
            self._status()
            time.sleep(0.2)
        if sys.stderr.isatty():
            print(file=sys.stderr)

    def _restart(self, g: Role) -> None:
        if not self.cfg.launch.allow_generator_restarts:
            raise RuntimeError(f"{g.name} exited with {g.poll()}:\n{g.tail()}")
        if g.restarts >= MAX_GENERATOR_RESTARTS:
            raise RuntimeError(f"{g.name} died {g.restarts + 1} times; giving up:\n{g.tail()}")
        g.restarts += 1
        print(
            f"[train] {g.name} exited with {g.poll()}; restarting (restart {g.restarts})",
            file=sys.stderr,
        )
        g.start()

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


def check_paths(cfg) -> None:
    """Files and directories the roles will open exist (caught here, not 20 s later in a role)."""
    if cfg.model.path and not Path(cfg.model.path).is_dir():
        raise ValueError(f"model.path: no such model directory: {cfg.model.path!r}")
    if cfg.model.reference_path and not Path(cfg.model.reference_path).is_dir():
        raise ValueError(f"model.reference_path: no such directory: {cfg.model.reference_path!r}")
    for key in ("source", "eval_source"):
        value = getattr(cfg.data, key)
        if value and parse_source(value) is None and not Path(value).is_file():
            raise ValueError(f"data.{key}: no such data file: {value!r}")


def check_resume(cfg) -> None:
    """``--resume`` continues an existing run: it needs run_dir and a checkpoint in it."""
    if not cfg.run_dir:
        raise ValueError("--resume needs run_dir=<the run directory to resume>")
    ckpts = Path(cfg.run_dir) / "checkpoints"
    if latest(ckpts) is None:  # the learner resumes from the same one
        raise ValueError(f"--resume: no checkpoint in {ckpts} (nothing to resume)")


def main(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, args.overrides)  # a ConfigError is reported by the CLI
    try:
        check_paths(cfg)
        if args.resume:
            check_resume(cfg)
        cfg, run_dir, cfg_path = prepare_run(cfg)
    except (WarmStartError, ValueError) as e:
        print(f"[train] error: {e}", file=sys.stderr)
        return 1
    buffer, learner, gens = make_roles(cfg, cfg_path, run_dir, args.resume)
    print(
        f"[train] run directory {run_dir}  (logs in {run_dir / 'logs'}, metrics in "
        f"{run_dir / 'metrics'})",
        file=sys.stderr,
    )
    sup = Supervisor(cfg, run_dir, buffer, learner, gens)
    old_int = signal.signal(signal.SIGINT, lambda signum, frame: sup.interrupted.append(signum))
    old_term = signal.signal(signal.SIGTERM, lambda signum, frame: sup.interrupted.append(signum))
    rc = 0
    try:
        sup.start()
        sup.watch()
    except KeyboardInterrupt:
        print("\n[train] interrupted: stopping all roles…", file=sys.stderr)
        rc = 130
    except RuntimeError as e:
        print(f"\n[train] error: {e}", file=sys.stderr)
        rc = 1
    finally:
        stop_all([buffer, learner, *gens], cfg.launch.shutdown_timeout_s)
        signal.signal(signal.SIGINT, old_int)
        signal.signal(signal.SIGTERM, old_term)
    if rc == 0:
        summary = summarize(run_dir, time.monotonic() - sup.t0, gens)
        print(json.dumps(summary) if args.json else format_summary(summary))
    return rc


def summarize(run_dir: Path, seconds: float, gens: list[Role]) -> dict:
    def load(name: str) -> dict:
        p = run_dir / name
        return json.loads(p.read_text()) if p.exists() else {}

    before, after, learner = (
        load("eval_before.json"),
        load("eval_after.json"),
        load("learner_summary.json"),
    )
    steps = [r for r in read_metrics(run_dir, "learner") if "rollout/trained_accuracy" in r]
    last = steps[-1] if steps else {}
    return {
        "run_dir": str(run_dir),
        "seconds": round(seconds, 1),
        "steps": learner.get("steps"),
        "learner_idle_ratio": learner.get("idle_ratio"),
        "heldout_accuracy_before": before.get("eval/accuracy"),
        "heldout_accuracy_after": after.get("eval/accuracy"),
        # the last step's rollouts: every sampled response, and the groups that were trained
        "sampled_accuracy_last": last.get("rollout/sampled_accuracy"),
        "trained_accuracy_last": last.get("rollout/trained_accuracy"),
        "generator_restarts": sum(g.restarts for g in gens),
    }


def format_summary(s: dict) -> str:
    def f(x):
        return "n/a" if x is None else f"{x:.3f}"

    return (
        f"\n=== dapo-async train: done in {s['seconds']:.0f}s, {s['steps']} steps ===\n"
        f"held-out accuracy: {f(s['heldout_accuracy_before'])} before → {f(s['heldout_accuracy_after'])} after\n"
        f"last step: accuracy of all sampled responses {f(s['sampled_accuracy_last'])}, "
        f"of the trained groups (after dynamic sampling) {f(s['trained_accuracy_last'])}\n"
        f"learner idle ratio: {f(s['learner_idle_ratio'])}   generator restarts: {s['generator_restarts']}\n"
        f"run directory: {s['run_dir']} (config.yaml, logs/, metrics/, checkpoints/, aim/)"
    )
