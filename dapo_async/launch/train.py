"""`dapo-async train CONFIG [overrides]`: every role on one machine, supervised.

    launcher ─┬─ buffer           (1 process; restarted from its write-ahead log)
              ├─ learner          (1 process, or torchrun with learner.num_ranks ranks;
              │                    restarted from its latest checkpoint)
              └─ generator × N    (restarted if they die and launch.allow_generator_restarts)

Order: resolve config and run directory → build the tiny model if needed → start the buffer
(its endpoint file appears) → learner → generators → supervise (status line every second) →
when the learner finishes: SIGTERM to the rest, SIGKILL after launch.shutdown_timeout_s → summary.
Each child leads its own process group, so stopping a role stops everything it started.
A role that dies is restarted with backoff (``launch/supervisor.py``); one that cannot come back
ends the run with its log tail and exit 1. Ctrl-C stops everything and exits 130.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from dataclasses import replace
from pathlib import Path

from dapo_async import eval_snapshots
from dapo_async.checkpoint_dirs import latest
from dapo_async.config import ConfigError, load_config, save_resolved
from dapo_async.config.paths import check_model_dirs
from dapo_async.data.tasks import parse_source
from dapo_async.devices import DevicePlan, cuda_device_count, plan_devices, role_env
from dapo_async.hub import resolve_paths
from dapo_async.keys import generate_keys, run_keys_dir
from dapo_async.launch.supervisor import Role, Supervisor, stop_all
from dapo_async.roles import LAUNCHER_PID_ENV
from dapo_async.tiny.build import WarmStartError, build
from dapo_async.tools.config_check import problems as config_problems
from dapo_async.tracking import index_aim_runs, read_metrics, repo_of
from dapo_async.utils import free_port
from dapo_async.weight_sync.slots import remove_slot_files


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "dapo_async.cli", *args]


def _new_run_dir(cfg) -> Path:
    if cfg.run_dir:
        return Path(cfg.run_dir)
    return Path("runs") / f"{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}"


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
    cfg = replace(resolve_paths(cfg), run_dir=str(run_dir))  # Hub ids: the roles read files
    if not cfg.model.path:
        build_tiny_policy(cfg)
    check_model_dirs(cfg)
    found = config_problems(cfg)  # `dapo-async config check`: lengths, tokenizer, data files
    for line in found:
        print(f"[train] config check: {line}", file=sys.stderr)
    if found:
        raise ConfigError("config check", f"{len(found)} problem(s), listed above")
    plan = device_plan(cfg)
    if plan.learner is not None and cfg.launch.spare_generators:
        raise ConfigError(
            "launch.spare_generators",
            "is for roles sharing CPU cores; on GPUs each role has its own device (set it to 0)",
        )
    if plan.learner is not None and cfg.weight_sync.backend == "auto":
        # NCCL refuses two ranks on one GPU: where generators share the learner's devices the
        # weights go through host memory (gloo)
        backend = plan.wsync_backend("auto")
        cfg = replace(cfg, weight_sync=replace(cfg.weight_sync, backend=backend))
        print(f"GPUs: learner {plan.learner}, generators {plan.generators}; weight sync {backend}")
    if cfg.weight_sync.mode == "auto":
        # every role is on this host: where no generator has a GPU of its own, the weights go
        # through shared memory (NCCL between GPUs is faster where each has one)
        mode = "dist" if plan.learner is not None and not plan.shared else "shm"
        cfg = replace(cfg, weight_sync=replace(cfg.weight_sync, mode=mode))
    if cfg.weight_sync.shm_slots == "auto":
        # generators on the learner's GPU open its slots there (CUDA IPC, device to device)
        slots = "cuda" if plan.generators_see_learner_gpu() else "host"
        cfg = replace(cfg, weight_sync=replace(cfg.weight_sync, shm_slots=slots))
    (run_dir / "endpoints").mkdir(parents=True, exist_ok=True)
    for stale in (run_dir / "endpoints").iterdir():
        stale.unlink()
    keys_dir = run_keys_dir(cfg.launch, run_dir)
    if keys_dir is not None and not cfg.launch.curve_keys_dir:
        generate_keys(keys_dir)  # this run's own CurveZMQ keys, before any role starts
    return cfg, run_dir, save_resolved(cfg, run_dir)


def device_plan(cfg) -> DevicePlan:
    """Which of this machine's GPUs each local role gets (``devices.plan_devices``)."""
    g = cfg.generator
    return plan_devices(
        cuda_device_count(), cfg.learner.num_ranks, g.num_generators, g.tensor_parallel_size
    )


def learner_command(cfg, cfg_path: Path, resume: bool) -> list[str]:
    """The learner (under torchrun with learner.num_ranks > 1, on a fresh port each time)."""
    cmd = _cli("learner", str(cfg_path), f"run_dir={cfg.run_dir}")
    if cfg.learner.num_ranks > 1:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={cfg.learner.num_ranks}",
            f"--master_port={free_port('127.0.0.1')}",
            *cmd[1:],
        ]
    return [*cmd, "--resume"] if resume else cmd


def make_roles(cfg, cfg_path: Path, run_dir: Path, resume: bool) -> tuple[Role, Role, list[Role]]:
    """(buffer, learner, generators), not started; each logs to ``run_dir/logs/<name>.log``.
    Which may restart, and how, is the launch config's (see ``launch/supervisor.py``)."""
    logs = run_dir / "logs"
    env = dict(
        os.environ,
        OMP_NUM_THREADS=str(cfg.launch.torch_threads),
        PYTHONUNBUFFERED="1",
        **{LAUNCHER_PID_ENV: str(os.getpid())},
    )
    lc = cfg.launch
    plan = device_plan(cfg)

    def resume_learner(role: Role) -> None:
        # from the latest checkpoint (or the start, publishing either way); generators must
        # not connect to the dead learner's weight-sync store
        (run_dir / "endpoints" / "wsync").unlink(missing_ok=True)
        role.cmd = learner_command(cfg, cfg_path, resume=True)

    buffer = Role(
        "buffer",
        _cli("buffer", str(cfg_path), f"run_dir={run_dir}"),
        logs / "buffer.log",
        env,
        restartable=lc.restart_roles and cfg.buffer.wal,
    )
    learner = Role(
        "learner",
        learner_command(cfg, cfg_path, resume),
        logs / "learner.log",
        role_env(env, plan.learner),
        restartable=lc.restart_roles,
        prepare=resume_learner,
    )
    gens = [
        Role(
            f"gen{i}",
            _cli("generator", str(cfg_path), f"run_dir={run_dir}", "--id", f"gen{i}"),
            logs / f"gen{i}.log",
            role_env(env, plan.generators[i]),
            restartable=lc.allow_generator_restarts,
        )
        for i in range(cfg.generator.num_generators)
    ]
    gens += [  # spares: CPU runs only (prepare_run refuses them on GPUs)
        Role(
            f"spare{i}",
            _cli("generator", str(cfg_path), f"run_dir={run_dir}", "--id", f"spare{i}", "--spare"),
            logs / f"spare{i}.log",
            role_env(env, plan.generators[0]),
            restartable=lc.allow_generator_restarts,
        )
        for i in range(lc.spare_generators)
    ]
    return buffer, learner, gens


def service_roles(cfg, run_dir: Path, env: dict) -> list[Role]:
    """Roles beside the data path: the reward-model server when ``reward.model_path`` is set
    (on launch.host, with the run's CurveZMQ keys; its endpoint in endpoints/reward)."""
    rc = cfg.reward
    if not rc.model_path or rc.model_endpoint:
        return []
    keys = run_keys_dir(cfg.launch, run_dir)
    # one port for the run: a restarted server comes back where the generators look for it
    port = free_port(cfg.launch.host)
    cmd = _cli("reward-server", "--model", rc.model_path, "--host", cfg.launch.host)
    cmd += ["--port", str(port)]
    cmd += ["--endpoint-file", str(run_dir / "endpoints" / "reward")]
    if keys is not None:
        cmd += ["--keys", str(keys)]
    return [
        Role(
            "reward",
            cmd,
            run_dir / "logs" / "reward.log",
            env,
            restartable=cfg.launch.restart_roles,
        )
    ]


def evaluator_roles(cfg, cfg_path: Path, run_dir: Path, env: dict) -> list[Role]:
    """The evaluator role, when evaluations (before, periodic, after) run in their own process:
    on generator 0's devices, where its engine (``eval.engine``) runs as the generators' does."""
    if not eval_snapshots.uses_evaluator(cfg):
        return []
    cmd = _cli("evaluator", str(cfg_path), f"run_dir={run_dir}")
    env = role_env(env, device_plan(cfg).generators[0])
    return [Role("evaluator", cmd, run_dir / "logs" / "evaluator.log", env, restartable=True)]


def check_paths(cfg) -> None:
    """Files and directories the roles will open exist (caught here, not 20 s later in a role)."""
    if cfg.model.path and not Path(cfg.model.path).is_dir():
        raise ValueError(f"model.path: no such model directory: {cfg.model.path!r}")
    if cfg.model.reference_path and not Path(cfg.model.reference_path).is_dir():
        raise ValueError(f"model.reference_path: no such directory: {cfg.model.reference_path!r}")
    if cfg.reward.model_path and not Path(cfg.reward.model_path).is_dir():
        raise ValueError(f"reward.model_path: no such model directory: {cfg.reward.model_path!r}")
    named = [("source", cfg.data.source), ("eval_source", cfg.data.eval_source)]
    named += [("sources", src) for src in cfg.data.sources]
    for key, value in named:
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
    services = service_roles(cfg, run_dir, buffer.env)
    extras = evaluator_roles(cfg, cfg_path, run_dir, buffer.env)
    print(
        f"[train] run directory {run_dir}  (logs in {run_dir / 'logs'}, metrics in "
        f"{run_dir / 'metrics'})",
        file=sys.stderr,
    )
    sup = Supervisor(cfg, run_dir, buffer, learner, gens, services, extras)
    old_int = signal.signal(signal.SIGINT, lambda signum, frame: sup.interrupted.append(signum))
    old_term = signal.signal(signal.SIGTERM, lambda signum, frame: sup.interrupted.append(signum))
    rc = 0
    try:
        sup.start()
        sup.watch()
        sup.drain()
    except KeyboardInterrupt:
        print("\n[train] interrupted: stopping all roles…", file=sys.stderr)
        rc = 130
    except RuntimeError as e:
        print(f"\n[train] error: {e}", file=sys.stderr)
        rc = 1
    finally:
        stop_all(sup.roles, cfg.launch.shutdown_timeout_s)  # services and extras too
        remove_slot_files(run_dir, run_dir.name)  # shared-memory weights a killed learner left
        signal.signal(signal.SIGINT, old_int)
        signal.signal(signal.SIGTERM, old_term)
    aim_repo = repo_of(cfg.tracking, run_dir)
    if aim_repo is not None:
        try:
            index_aim_runs(aim_repo)  # the run's Aim runs listed at once (SDK and UI)
        except Exception as e:  # never fail a finished run over its dashboard
            print(
                f"[train] Aim index not updated ({e}); `aim storage reindex` does it",
                file=sys.stderr,
            )
    if rc == 0:
        summary = summarize(run_dir, time.monotonic() - sup.t0, gens, sup.t0_wall)
        summary["aim_repo"] = aim_repo
        print(json.dumps(summary) if args.json else format_summary(summary))
    return rc


def summarize(
    run_dir: Path, seconds: float, gens: list[Role], started_wall: float | None = None
) -> dict:
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
    first_step_s = None  # `train` started → the learner's first step logged
    if steps and started_wall is not None:
        first_step_s = round(steps[0]["time"] - started_wall, 1)
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
        "start_to_first_step_s": first_step_s,
    }


def format_summary(s: dict) -> str:
    def f(x):
        return "n/a" if x is None else f"{x:.3f}"

    return (
        f"\n=== dapo-async train: done in {s['seconds']:.0f}s, {s['steps']} steps ===\n"
        f"held-out accuracy: {f(s['heldout_accuracy_before'])} before → {f(s['heldout_accuracy_after'])} after\n"
        f"last step: accuracy of all sampled responses {f(s['sampled_accuracy_last'])}, "
        f"of the trained groups (after dynamic sampling) {f(s['trained_accuracy_last'])}\n"
        f"learner idle ratio: {f(s['learner_idle_ratio'])}   generator restarts: {s['generator_restarts']}   "
        f"start to first step: {s['start_to_first_step_s']}s\n"
        f"run directory: {s['run_dir']} (config.yaml, logs/, metrics/, samples/, checkpoints/); "
        f"Aim: {s.get('aim_repo') or 'off'}"
    )
