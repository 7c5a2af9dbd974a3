"""Small helpers shared by tests in several folders (importable: tests/ is on sys.path)."""

import json
import subprocess
import sys

import torch

# A short main job on the fixture model (learner.num_steps set by each test): small steps, no
# Aim, no dynamic sampling (the barely warm-started fixture would have every group filtered).
TRAIN_FAST = [
    "buffer.groups_per_step=4",
    "generator.prompts_per_batch=4",
    "generator.responses_per_prompt=4",
    "data.num_eval=16",
    "tracking.aim=false",
    "buffer.dynamic_sampling=false",
    "launch.shutdown_timeout_s=10",
]


def run_cli(repo, env, *args, timeout: float = 600) -> subprocess.CompletedProcess:
    """`python -m dapo_async.cli ARGS` in the repo, output captured."""
    return subprocess.run(
        [sys.executable, "-m", "dapo_async.cli", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=repo,
        env=env,
        timeout=timeout,
    )


def last_json(out: subprocess.CompletedProcess) -> dict:
    """The JSON object on the last line of stdout (the `--json` convention)."""
    return json.loads(out.stdout.strip().splitlines()[-1])


def greedy_tokens(model, prompt, eos_id, max_tokens: int = 30) -> list[int]:
    """Greedy decoding with one full forward pass per token (no cache, no padding): the
    reference the engines are compared with."""
    ids, out = list(prompt), []
    with torch.no_grad():
        for _ in range(max_tokens):
            nxt = int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax())
            out.append(nxt)
            ids.append(nxt)
            if nxt == eos_id:
                break
    return out


def run_vllm_script(script, env, *args, timeout: float = 600):
    """Run a vLLM script in its own process (vLLM spawns an engine core, so it needs a
    ``__main__`` guard) and return the JSON it prints on its ``RESULT `` line."""
    out = subprocess.run(
        [sys.executable, str(script), *map(str, args)],
        capture_output=True,
        text=True,
        env={**env, "HF_HUB_OFFLINE": "1"},
        timeout=timeout,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    line = next(x for x in out.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])


def max_generator_version(run_dir) -> float:
    """The newest policy version any generator of the run generated with (its metrics)."""
    from pathlib import Path

    return max(
        json.loads(line).get("generator/version", -1)
        for f in (Path(run_dir) / "metrics").glob("gen*.jsonl")
        for line in f.read_text().splitlines()
    )
