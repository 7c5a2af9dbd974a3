"""The GPU checks in one run (``bash tools/gpu_check.sh``), for a machine with NVIDIA GPUs and the
GPU flavour already installed (nothing is downloaded: the tiny policy is built here).

1. the ``gpu``-marked tests, then the CPU-provable GPU-path tests on this machine;
2. the main job on one GPU, learner and generator sharing it (weight sync falls back to gloo
   through pinned host buffers): learner steps/s, held-out accuracy before/after;
3. with ≥ 2 GPUs: the main job with the learner and a vLLM generator on separate GPUs, NCCL weight
   sync into the vLLM worker; ``bench weights --backend nccl`` (bucketed GB/s and its ratio to a
   flat NCCL broadcast);
4. ``bench generator --engine vllm`` (tokens/s).

Without vLLM installed, the vLLM tests are skipped and the hf engine stands in (the JSON says so).

and prints one JSON line with the figures (stderr has the progress).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

# Each stage gets this long before the check gives up on it (a hang fails the stage, not the
# machine lease): tests and runs on a tiny model take well under it.
STAGE_TIMEOUT_S = 1200
GPU_TESTS = [
    "tests/weight_sync/test_gpu.py",
    "tests/test_devices.py",
    "tests/learner/test_devices_dtypes.py",
    "tests/learner/test_logprobs.py",
    "tests/weight_sync/test_gpu_paths.py",
]
VLLM_TESTS = ["tests/generator/test_engines.py", "tests/weight_sync/test_vllm_sync.py"]


def _log(msg: str) -> None:
    print(f"[gpu_check] {msg}", file=sys.stderr, flush=True)


def _run(cmd: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    _log(" ".join(cmd))
    res = subprocess.run(
        cmd, env=env, capture_output=True, text=True, timeout=STAGE_TIMEOUT_S, check=False
    )
    if res.returncode != 0:
        sys.stderr.write(res.stdout[-4000:] + res.stderr[-4000:])
        raise SystemExit(f"[gpu_check] failed: {' '.join(cmd)}")
    return res


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "dapo_async.cli", *args]


def _last_json(res: subprocess.CompletedProcess) -> dict:
    return json.loads(res.stdout.strip().splitlines()[-1])


def train_run(run_dir: Path, visible: str, *overrides: str) -> dict:
    """The main job on GPUs ``visible``; its learner steps/s and held-out before/after."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=visible)
    _run(_cli("train", "configs/tiny_cpu.yaml", f"run_dir={run_dir}", *overrides), env)
    summary = json.loads((run_dir / "learner_summary.json").read_text())
    before = json.loads((run_dir / "eval_before.json").read_text())["eval/accuracy"]
    after = json.loads((run_dir / "eval_after.json").read_text())["eval/accuracy"]
    return {
        "learner_steps_per_s": summary["steps"] / max(summary["train_seconds"], 1e-9),
        "learner_idle_ratio": summary["idle_ratio"],
        "heldout_before": before,
        "heldout_after": after,
    }


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
    out["vllm"] = "installed" if has_vllm else "not installed: vLLM stages skipped"
    _run(_cli("init-tiny", "--out", ".cache/tiny"))
    tests = GPU_TESTS + (VLLM_TESTS if has_vllm else [])
    _run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests])
    out["tests"] = "passed"
    root = Path(os.environ.get("DAPO_GPU_CHECK_DIR", f"runs/gpu-check-{time.strftime('%H%M%S')}"))
    out["shared_gpu"] = train_run(root / "shared", "0", "generator.engine=hf")
    out.update({k: out["shared_gpu"][k] for k in ("heldout_before", "heldout_after")})
    out["learner_steps_per_s"] = out["shared_gpu"]["learner_steps_per_s"]
    engine = "vllm" if has_vllm else "hf"
    if gpus >= 2:
        out["two_gpus"] = train_run(root / "two", "0,1", f"generator.engine={engine}")
        w = _last_json(
            _run(_cli("bench", "weights", "--backend", "nccl", "--rounds", "3", "--json"))
        )
        out["weight_sync_gb_per_s"] = w["gb_per_s_bucketed_500mb"]
        out["weight_sync_ratio_to_flat_nccl"] = w["ratio_500mb"]
    else:
        _log("one GPU: the NCCL weight-sync and vLLM-on-its-own-GPU stages need two")
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="1" if gpus >= 2 else "0")
    g = _last_json(_run(_cli("bench", "generator", "--engine", engine, "--json"), env))
    out["generator_tokens_per_s"] = g["engine_tokens_per_s"]
    out["generator_engine"] = engine
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
