"""`dapo-async bench learn`: does the main job learn on this machine, whatever the init seed?

For each init seed (``--init-seeds``, default 0,1,2) the launcher builds the built-in tiny policy
from scratch in its own cache dir (``<cache-root>/tiny-seed<S>``, with ``model.tiny_seed=S``:
weights and warm-start data), then runs the main job once per RL seed (``--rl-seeds``, default
0,1: sampling, prompt order, held-out sample). One JSON line: per-run held-out greedy accuracy
before and after, ``gain_min``, ``gain_mean``, ``before_mean``, ``after_mean``, the warm start's
steps per init seed, ``cpu_model`` (from /proc/cpuinfo), ``machine`` (model name, cores and
data caches: ``bench.common.machine``) and ``minutes`` (the whole bench).

``--task tiny:calc`` runs the multi-turn calculator job (configs/tiny_calc.yaml, policies in
``<cache-root>/tiny-calc-seed<S>``) and adds the share of held-out episodes that call the tool,
before and after (``tool_call_before`` / ``tool_call_after``, per run and as means).

A cached tiny policy is reused only when its fingerprint matches; ``--fresh`` deletes the cache
dirs first, so the warm start runs here, on this CPU (what a fresh clone does).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from dapo_async.bench.common import (
    heldout_accuracy,
    machine,
    parse_seeds,
    print_result,
    run_train,
)
from dapo_async.tiny.build import META_NAME, cpu_model


def read_result(run_dir: Path) -> dict[str, float]:
    """Held-out accuracy before and after one run, and its gain."""
    before, after = heldout_accuracy(run_dir, "before"), heldout_accuracy(run_dir, "after")
    out = {"before": before, "after": after, "gain": after - before}
    for when in ("before", "after"):  # multi-turn tasks: the share of episodes using a tool
        path = run_dir / f"eval_{when}.json"
        figures = json.loads(path.read_text()) if path.is_file() else {}
        if "eval/rollout/tool_call" in figures:
            out[f"tool_call_{when}"] = figures["eval/rollout/tool_call"]
    return out


def aggregate(runs: list[dict]) -> dict[str, float]:
    """gain_min / gain_mean / before_mean / after_mean over ``runs``."""
    if not runs:
        raise ValueError("no runs to aggregate")

    def mean(key: str) -> float:
        return sum(r[key] for r in runs) / len(runs)

    return {
        "gain_min": min(r["gain"] for r in runs),
        "gain_mean": mean("gain"),
        "before_mean": mean("before"),
        "after_mean": mean("after"),
    }


def tool_means(runs: list[dict]) -> dict[str, float]:
    """Mean share of held-out episodes calling a tool, before and after (multi-turn tasks)."""
    return {
        f"tool_call_{w}_mean": sum(r[f"tool_call_{w}"] for r in runs) / len(runs)
        for w in ("before", "after")
        if all(f"tool_call_{w}" in r for r in runs)
    }


def main(args: argparse.Namespace) -> int:
    from dapo_async.bench.options import TASK_CONFIGS
    from dapo_async.config import load_config
    from dapo_async.data.tasks import parse_source

    init_seeds = parse_seeds(args.init_seeds, "--init-seeds")
    rl_seeds = parse_seeds(args.rl_seeds, "--rl-seeds")
    base = ["tracking.aim=false", *args.overrides]
    config = args.config or TASK_CONFIGS[args.task]
    # fail fast on a bad override, before minutes of training
    family = parse_source(load_config(config, base).data.source) or "chain"
    cache_root = Path(args.cache_root)
    root = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="dapo-bench-learn-"))
    t0 = time.monotonic()
    runs: list[dict] = []
    warm_start_steps: dict[str, int] = {}
    for init_seed in init_seeds:
        # the main job's policies keep their old place; another task's warm start its own
        name = f"tiny-seed{init_seed}" if family == "chain" else f"tiny-{family}-seed{init_seed}"
        tiny_dir = cache_root / name
        if args.fresh:
            shutil.rmtree(tiny_dir, ignore_errors=True)
        for rl_seed in rl_seeds:
            run_dir = root / f"init{init_seed}-rl{rl_seed}"
            extra = [
                f"model.tiny_dir={tiny_dir}",
                f"model.tiny_seed={init_seed}",
                f"seed={rl_seed}",
            ]
            run_train(config, [*base, *extra], run_dir, tag="bench learn")
            r = {"init_seed": init_seed, "rl_seed": rl_seed, **read_result(run_dir)}
            runs.append(r)
            print(
                f"[bench learn] init seed {init_seed}, RL seed {rl_seed}: held-out "
                f"{r['before']:.3f} → {r['after']:.3f} (gain {r['gain']:+.3f})",
                file=sys.stderr,
                flush=True,
            )
        meta = json.loads((tiny_dir / META_NAME).read_text())
        warm_start_steps[str(init_seed)] = meta.get("sft_steps_run", 0)
    out = {
        "runs": runs,
        **aggregate(runs),
        **tool_means(runs),
        "warm_start_steps": warm_start_steps,
        "cpu_model": cpu_model(),
        "machine": machine(),  # model name, cores and caches: two "AMD EPYC"s differ twofold
        "minutes": round((time.monotonic() - t0) / 60, 2),
        "config": config,
        "run_root": str(root),
    }
    return print_result(
        f"[bench learn] {len(runs)} runs on {out['machine']}: held-out "
        f"{out['before_mean']:.3f} → {out['after_mean']:.3f} on average; gain min "
        f"{out['gain_min']:+.3f}, mean {out['gain_mean']:+.3f} ({out['minutes']:.1f} min)",
        out,
        args.json,
    )
