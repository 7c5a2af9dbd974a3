"""The Python API for notebooks and scripts: the same jobs as the command line, returning dicts.

    import dapo_async
    summary = dapo_async.train("configs/tiny_cpu.yaml", learner__num_steps=10)
    summary["heldout_accuracy_after"]
    dapo_async.evaluate(model=summary["run_dir"] + "/checkpoints/step_000010", k=4)

Overrides: a list of ``key.path=value`` strings or a dict ``{"key.path": value}`` as
``overrides``, and keyword arguments with ``__`` for the dots (``algo__clip_high=0.3``).
``train`` runs `dapo-async train` (every role in its own process, supervised) and streams its
progress to this process's stderr; ``evaluate`` runs in this process.
"""

from __future__ import annotations

import json
import subprocess
import sys


def _overrides(overrides, kwargs: dict) -> list[str]:
    if isinstance(overrides, dict):
        out = [f"{k}={_value(v)}" for k, v in overrides.items()]
    else:
        out = list(overrides or [])
    out += [f"{k.replace('__', '.')}={_value(v)}" for k, v in kwargs.items()]
    return out


def _value(v) -> str:
    """A Python value as an override's right-hand side (lists and dicts as JSON)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (list, dict)):
        return json.dumps(v)
    return str(v)


def train(config: str = "configs/tiny_cpu.yaml", overrides=None, **kwargs) -> dict:
    """Run the training job; its summary (run_dir, steps, held-out accuracy before/after,
    learner idle, start to first step, ...). Raises RuntimeError when the job fails."""
    cmd = [sys.executable, "-m", "dapo_async.cli", "train", config, "--json"]
    cmd += _overrides(overrides, kwargs)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    tail: list[str] = []
    for line in proc.stderr:  # progress as it comes (a notebook shows this process's stderr)
        sys.stderr.write(line)
        tail = (tail + [line])[-20:]
    out = proc.stdout.read()
    if proc.wait() != 0:
        raise RuntimeError(f"dapo-async train failed ({proc.returncode}):\n{''.join(tail)}")
    return json.loads(out.strip().splitlines()[-1])


def evaluate(
    config: str | None = None,
    model: str = "",
    k: int | None = None,
    engine: str | None = None,
    overrides=None,
    **kwargs,
) -> dict:
    """avg@k and pass@k on held-out prompts (overall and per data source), as `dapo-async eval`
    computes them: the run config's data, reward and ``eval`` section (the tiny task without
    one); ``k`` and ``engine`` override ``eval.k`` and ``eval.engine``."""
    from dapo_async.cli import parse_args
    from dapo_async.tools.eval_cmd import run_eval

    argv = ["eval"]
    if k is not None:
        argv += ["--k", str(k)]
    if engine is not None:
        argv += ["--engine", engine]
    if config:
        argv += ["--config", config]
    if model:
        argv += ["--model", model]
    return run_eval(parse_args(argv + _overrides(overrides, kwargs)))
