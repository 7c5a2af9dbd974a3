"""The GPU checks in one run (``bash tools/gpu_check.sh``), for a machine with NVIDIA GPUs and the
GPU flavour already installed (nothing is downloaded: the tiny policy is built here, or reused
from ``.cache/tiny`` when carried in).

Every stage runs even when an earlier one failed; each one's result (figures, or the error's
last lines) goes into the JSON, and the exit status is 1 when any failed:

1. ``tiny``: build or reuse the tiny policy;
2. ``tests``: the ``gpu``-marked tests and the device-path tests, in one pytest process (they
   must pass together, in any order);
3. ``main_stream`` / ``main_batch``: the main job on one GPU, learner and generator sharing it,
   default stream generation and batch generation: held-out before/after, learner steps/s, idle,
   start to first step;
4. ``bench_learner``: the learner's step on a Qwen2.5-0.5B-shaped model at 8k and 32k response
   tokens: tokens/s, MFU, peak memory, chunked vs unchunked vs activation checkpointing;
5. ``bench_weights``: weight sync on this machine (shared memory vs gloo vs a memory copy);
6. ``bench_generator``: the generator's tokens/s (vLLM where installed, else hf);
7. with ≥ 2 GPUs: the main job with learner and generator on their own GPUs (NCCL weight sync).

The whole check is sized for 10 minutes on one GPU (``STAGE_TIMEOUT_S`` bounds each stage).
Without vLLM installed, the vLLM tests are skipped and the hf engine stands in (the JSON says so).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

# Each stage gets at most this long (a hang fails the stage, not the whole check). The one-GPU
# stages add up to 10 minutes: the bound the check is sized for (the tiny policy carried in).
STAGE_TIMEOUT_S = {
    "tiny": 45,
    "tests": 135,
    "main_stream": 120,
    "main_batch": 90,
    "bench_learner": 120,
    "bench_weights": 45,
    "bench_generator": 45,
    "two_gpus": 120,
}
GPU_TESTS = [
    "tests/weight_sync/test_gpu.py",
    "tests/test_devices.py",
    "tests/learner/test_devices_dtypes.py",
    "tests/learner/test_logprobs.py",
    "tests/weight_sync/test_gpu_paths.py",
    "tests/generator/test_hf_devices.py",
    "tests/learner/test_step_devices.py",
]
VLLM_TESTS = ["tests/generator/test_engine_interface.py", "tests/weight_sync/test_vllm_sync.py"]


class StageFailed(RuntimeError):
    pass


def _log(msg: str) -> None:
    print(f"[gpu_check] {msg}", file=sys.stderr, flush=True)


def _run(cmd: list[str], timeout_s: float, env: dict | None = None) -> subprocess.CompletedProcess:
    _log(" ".join(cmd))
    try:
        res = subprocess.run(
            cmd, env=env, capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired as e:
        raise StageFailed(f"timed out after {timeout_s}s: {' '.join(cmd)}") from e
    if res.returncode != 0:
        raise StageFailed(f"exit {res.returncode}: {(res.stdout[-1500:] + res.stderr[-2500:])}")
    return res


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "dapo_async.cli", *args]


def _last_json(res: subprocess.CompletedProcess) -> dict:
    return json.loads(res.stdout.strip().splitlines()[-1])


def train_run(run_dir: Path, visible: str, timeout_s: float, *overrides: str) -> dict:
    """The main job on GPUs ``visible``: its summary (held-out, idle, start-up) and steps/s."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=visible)
    res = _run(
        _cli("train", "configs/tiny_cpu.yaml", "--json", f"run_dir={run_dir}", *overrides),
        timeout_s,
        env,
    )
    summary = _last_json(res)
    learner = json.loads((run_dir / "learner_summary.json").read_text())
    keep = (
        "heldout_accuracy_before",
        "heldout_accuracy_after",
        "learner_idle_ratio",
        "start_to_first_step_s",
        "seconds",
        "steps",
    )
    out = {k: summary.get(k) for k in keep}
    out["learner_steps_per_s"] = learner["steps"] / max(learner["train_seconds"], 1e-9)
    return out


def stages(gpus: int, has_vllm: bool, root: Path) -> list[tuple[str, object]]:
    """(name, function returning the stage's figures) in the order they run."""
    t = STAGE_TIMEOUT_S
    engine = "vllm" if has_vllm else "hf"
    tests = GPU_TESTS + (VLLM_TESTS if has_vllm else [])
    pytest = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests]
    gen_env = dict(os.environ, CUDA_VISIBLE_DEVICES="1" if gpus >= 2 else "0")
    out = [
        ("tiny", lambda: {"ok": bool(_run(_cli("init-tiny", "--out", ".cache/tiny"), t["tiny"]))}),
        ("tests", lambda: {"summary": _run(pytest, t["tests"]).stdout.strip().splitlines()[-1]}),
        ("main_stream", lambda: train_run(root / "stream", "0", t["main_stream"])),
        (
            "main_batch",
            lambda: train_run(root / "batch", "0", t["main_batch"], "generator.mode=batch"),
        ),
        (
            "bench_learner",
            lambda: _last_json(_run(_cli("bench", "learner", "--json"), t["bench_learner"])),
        ),
        (
            "bench_weights",
            lambda: _last_json(
                _run(_cli("bench", "weights", "--rounds", "2", "--json"), t["bench_weights"])
            ),
        ),
        (
            "bench_generator",
            lambda: _last_json(
                _run(
                    _cli("bench", "generator", "--engine", engine, "--json"),
                    t["bench_generator"],
                    gen_env,
                )
            ),
        ),
    ]
    if gpus >= 2:
        out.append(
            (
                "two_gpus",
                lambda: train_run(root / "two", "0,1", t["two_gpus"], f"generator.engine={engine}"),
            )
        )
    return out


def run_stages(named: list[tuple[str, object]]) -> tuple[dict, list[str]]:
    """Run every stage; (results by name, names of the failed ones)."""
    results, failed = {}, []
    for name, fn in named:
        t0 = time.monotonic()
        try:
            results[name] = {"ok": True, **fn()}
        except Exception as e:  # a failed stage is recorded; the next one still runs
            failed.append(name)
            results[name] = {"ok": False, "error": str(e)[-3000:]}
            _log(f"stage {name} FAILED: {str(e)[-600:]}")
        results[name]["seconds"] = round(time.monotonic() - t0, 1)
    return results, failed


def main() -> int:
    import torch

    if not torch.cuda.is_available():
        raise SystemExit(
            "[gpu_check] torch sees no GPU (install the GPU flavour: docs/development.md)"
        )
    gpus = torch.cuda.device_count()
    out: dict = {"gpus": gpus, "device": torch.cuda.get_device_name(0), "torch": torch.__version__}
    _log(f"{gpus} GPU(s): {out['device']}")
    has_vllm = importlib.util.find_spec("vllm") is not None
    out["vllm"] = "installed" if has_vllm else "not installed: vLLM stages skipped, hf stands in"
    root = Path(os.environ.get("DAPO_GPU_CHECK_DIR", f"runs/gpu-check-{time.strftime('%H%M%S')}"))
    out["stages"], out["failed"] = run_stages(stages(gpus, has_vllm, root))
    print(json.dumps(out))
    return 1 if out["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
