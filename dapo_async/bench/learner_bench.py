"""`dapo-async bench learner`: the learner's real step — log-probs through ``ResponseLogProbs``,
the DAPO loss, backward, AdamW (``Trainer.step``) — on a real-shaped model built here with random
weights (nothing downloaded), at long response lengths, three ways:

- ``unchunked``: every response position's logits at once (``learner.logprob_chunk_tokens=0``);
- ``chunked``: the default chunk (logits for one chunk at a time, recomputed in backward);
- ``chunked_ac``: chunked, plus activation checkpointing of every decoder layer.

Shapes: on a GPU Qwen2.5-0.5B's (24 layers, hidden 896, vocabulary 151,936, tied embeddings;
bf16 compute over fp32 master weights, as the learner runs there); on a CPU a scaled-down Qwen2
(``SHAPES["cpu"]``: the LM head still dominates, as at scale) in fp32.

Each (variant, length) runs in a fresh process: one warm-up step on a short batch, then the
timed steps. Per step the batch is one group of two responses of ``tokens / 2`` each after a
``PROMPT_TOKENS`` prompt, one micro-batch. Figures:

- ``tokens_per_s``: response tokens trained per second;
- ``mfu``: model FLOPs per second over the device's peak. Model FLOPs per step = 3 × forward
  (forward + backward, recomputation not counted): 2 × (decoder matmul parameters) × every token,
  2 × hidden × vocabulary × response tokens (the head runs on response positions only), and
  causal attention 2 × 2 × seq² / 2 × hidden per layer and row. The peak: the GPU's datasheet bf16
  dense figure (``PEAK_TFLOPS``), and on every device the rate of a large matmul measured in the
  same process in the compute dtype (``mfu_vs_matmul``);
- ``peak_mib``: memory the step adds at its peak — CUDA's ``max_memory_allocated`` above what
  was allocated before it; on the CPU the process's peak resident-set growth (machine- and
  allocator-dependent: a benchmark figure, never a test assertion).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

from dapo_async.bench.common import print_result

VARIANTS = {
    "unchunked": ["learner.logprob_chunk_tokens=0"],
    "chunked": [],
    "chunked_ac": ["learner.activation_checkpointing=true"],
}
SHAPES = {
    "qwen2.5-0.5b": dict(
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        vocab_size=151936,
        tie_word_embeddings=True,
    ),
    "cpu": dict(
        hidden_size=256,
        intermediate_size=1024,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=16384,
        tie_word_embeddings=True,
    ),
}
PROMPT_TOKENS = 256
WARMUP_TOKENS = 256
# bf16 dense tensor-core peaks from the vendors' datasheets (SXM parts), TFLOP/s
PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10G": 125.0}
# Square matmul side for the measured peak (GPU, CPU): large enough to reach the plateau.
MATMUL_SIDE = {"cuda": 8192, "cpu": 2048}


def default_shape() -> str:
    from dapo_async.devices import on_gpu

    return "qwen2.5-0.5b" if on_gpu() else "cpu"


def build_model(shape: str):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(**SHAPES[shape], max_position_embeddings=PROMPT_TOKENS + (1 << 17))
    return Qwen2ForCausalLM(cfg)


def model_flops(cfg, response_tokens: int) -> float:
    """Forward + backward model FLOPs of one step (module docstring)."""
    h, layers = cfg.hidden_size, cfg.num_hidden_layers
    kv = cfg.num_key_value_heads * (h // cfg.num_attention_heads)
    per_layer = h * (h + 2 * kv) + h * h + 3 * h * cfg.intermediate_size
    rows, seq = 2, PROMPT_TOKENS + response_tokens // 2
    forward = 2 * per_layer * layers * rows * seq
    forward += 2 * h * cfg.vocab_size * response_tokens
    forward += layers * rows * 2 * seq * seq * h  # QKᵀ and AV, causal half, 2 FLOPs a MAC
    return 3.0 * forward


def _groups(response_tokens: int, vocab: int):
    import numpy as np

    from dapo_async import protocol as P

    rng = np.random.default_rng(0)
    n = response_tokens // 2
    return [
        P.Group(
            generator_id="bench",
            seq=0,
            prompt_id=0,
            prompt_tokens=rng.integers(10, vocab, PROMPT_TOKENS).astype(np.int32),
            response_lens=np.array([n, n], np.int32),
            tokens=rng.integers(10, vocab, 2 * n).astype(np.int32),
            logprobs=rng.uniform(-12.5, -11.5, 2 * n).astype(np.float32),
            versions=np.zeros(2 * n, np.int32),
            rewards=np.array([1.0, -1.0], np.float32),
            acc=np.array([1.0, 0.0], np.float32),
            components=np.zeros((2, 1), np.float32),
            finish=np.zeros(2, np.uint8),
        )
    ]


def _trainer(model, variant: str, response_tokens: int, device):
    from dapo_async.config import load_config
    from dapo_async.devices import resolve_dtype
    from dapo_async.learner.parallel import Parallel
    from dapo_async.learner.trainer import Trainer

    budget = 2 * (PROMPT_TOKENS + response_tokens // 2)
    cfg = load_config(
        None,
        [
            f"learner.micro_batch_tokens={budget}",
            "learner.num_minibatches=1",
            f"generator.max_tokens={response_tokens // 2}",
            f"data.max_prompt_len={PROMPT_TOKENS}",
            f"generator.max_model_len={PROMPT_TOKENS + response_tokens // 2}",
            "reward.overlong_shaping=false",
            *VARIANTS[variant],
        ],
    )
    lc = cfg.learner
    par = Parallel(
        model,
        0,
        1,
        fsdp=False,
        activation_checkpointing=lc.activation_checkpointing,
        compute_dtype=resolve_dtype(lc.compute_dtype, device),
        logprob_chunk_tokens=lc.logprob_chunk_tokens,
    )
    return Trainer(par, cfg.algo, lc, pad_id=0, temperature=1.0, max_tokens=response_tokens // 2)


def matmul_tflops(device, dtype) -> float:
    """Measured rate of a large square matmul on ``device`` in ``dtype`` (TFLOP/s)."""
    import torch

    n = MATMUL_SIDE["cuda" if device.type == "cuda" else "cpu"]
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    a @ b
    _sync(device)
    reps, t0 = 0, time.perf_counter()
    while reps < 3 or time.perf_counter() - t0 < 0.5:
        a @ b
        reps += 1
    _sync(device)
    return 2 * n**3 * reps / (time.perf_counter() - t0) / 1e12


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _peak_mib(device) -> float:
    import torch

    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def measure(variant: str, response_tokens: int, shape: str, steps: int) -> dict:
    """In this process: one warm-up step, then ``steps`` timed steps at ``response_tokens``."""
    import torch

    from dapo_async.devices import learner_device

    device = learner_device(0)
    model = build_model(shape).to(device)
    trainer = _trainer(model, variant, response_tokens, device)
    vocab = model.config.vocab_size
    trainer.step(_groups(WARMUP_TOKENS, vocab))
    _sync(device)
    if device.type == "cuda":
        base = torch.cuda.memory_allocated(device) / 2**20
        torch.cuda.reset_peak_memory_stats(device)
    else:
        base = _peak_mib(device)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        metrics = trainer.step(_groups(response_tokens, vocab))
        _sync(device)
        times.append(time.perf_counter() - t0)
    peak = _peak_mib(device) - base
    compute = trainer.par.autocast_dtype or next(model.parameters()).dtype
    seconds = min(times)
    flops = model_flops(model.config, response_tokens) / seconds / 1e12
    out = {
        "seconds": seconds,
        "tokens_per_s": response_tokens / seconds,
        "model_tflops": flops,
        "matmul_tflops": matmul_tflops(device, compute),
        "peak_mib": peak,
        "loss": float(metrics["train/loss"]),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
    }
    out["mfu_vs_matmul"] = flops / out["matmul_tflops"]
    peak_tflops = next((v for k, v in PEAK_TFLOPS.items() if k in out["device"]), None)
    out["mfu"] = flops / peak_tflops if peak_tflops else None
    return out


def measure_in_subprocess(variant: str, response_tokens: int, shape: str, steps: int) -> dict:
    cmd = [sys.executable, "-m", __name__, variant, str(response_tokens), shape, str(steps)]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise RuntimeError(
            f"bench learner {variant} at {response_tokens} failed:\n{res.stderr[-2000:]}"
        )
    return json.loads(res.stdout.strip().splitlines()[-1])


def _parse_tokens(text: str) -> list[int]:
    try:
        tokens = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise SystemExit(
            f"bench learner: --tokens wants integers like 8192,32768, got {text!r}"
        ) from None
    if not tokens or any(t < 2 or t % 2 for t in tokens):
        raise SystemExit(f"bench learner: --tokens wants even lengths >= 2, got {text!r}")
    return tokens


def main(args: argparse.Namespace) -> int:
    shape = args.shape or default_shape()
    if shape not in SHAPES:
        raise SystemExit(f"bench learner: --shape is one of {', '.join(SHAPES)}, got {shape!r}")
    out: dict = {"shape": shape, "prompt_tokens": PROMPT_TOKENS, "steps": args.steps}
    lines = []
    for n in _parse_tokens(args.tokens):
        got = {}
        for v in VARIANTS:
            print(f"[bench learner] {v} at {n} response tokens ...", file=sys.stderr, flush=True)
            got[v] = measure_in_subprocess(v, n, shape, args.steps)
        out["device"] = got["chunked"]["device"]
        for v, r in got.items():
            for k in ("tokens_per_s", "mfu", "mfu_vs_matmul", "peak_mib", "seconds"):
                out[f"{v}_{n}_{k}"] = r[k]
        out[f"matmul_tflops_{n}"] = got["chunked"]["matmul_tflops"]
        out[f"chunked_time_vs_unchunked_{n}"] = (
            got["chunked"]["seconds"] / got["unchunked"]["seconds"]
        )
        out[f"chunked_memory_vs_unchunked_{n}"] = got["chunked"]["peak_mib"] / max(
            got["unchunked"]["peak_mib"], 1.0
        )
        lines.append(
            f"{n} tokens: "
            + ", ".join(
                f"{v} {r['tokens_per_s']:.0f} tok/s, {r['peak_mib']:.0f} MiB, "
                f"MFU {r['mfu_vs_matmul']:.2f} of matmul"
                for v, r in got.items()
            )
        )
    summary = f"[bench learner] {shape} on {out['device']}: " + "; ".join(lines)
    return print_result(summary, out, args.json)


if __name__ == "__main__":
    variant, tokens, shape, steps = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    print(json.dumps(measure(variant, tokens, shape, steps)))
