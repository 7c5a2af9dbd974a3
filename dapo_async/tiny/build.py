"""`dapo-async init-tiny`: build, warm-start and cache the built-in tiny policy.

Steps: character tokenizer → tiny Llama (seeded) → a short supervised warm start on correct
solutions of a synthetic task (so the policy starts with low but non-zero reward: RL needs
signal) → save as a normal HF model directory → held-out greedy accuracy. The directory holds
``tiny_meta.json`` with a fingerprint of everything that shaped it; a second call with the same
arguments reuses it.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import sys
import time
from pathlib import Path

META_NAME = "tiny_meta.json"
BUILD_VERSION = 4
# Warm start: enough steps to learn the format and the step-by-step arithmetic (the SFT loss that
# `init-tiny` prints drops sharply between steps 700 and 850), while the shortcut answers below
# keep held-out accuracy low (docs/quickstart.md).
SFT_STEPS = 1000
SFT_BATCH = 64
SFT_LR = 3e-3
SFT_DIFFICULTY = 3
# Fraction of warm-start solutions whose final "Answer:" reports a shortcut (the prompt's first
# number) instead of the worked-out result: the policy computes the steps but mostly reports the
# shortcut, so RL starts from low accuracy with a clear signal to learn from (docs/quickstart.md).
SFT_CORRUPT_P = 0.7
EVAL_PROMPTS = 256
EVAL_MAX_TOKENS = 40


def fingerprint(seed: int, task: str, sft_steps: int) -> dict:
    return {
        "build_version": BUILD_VERSION,
        "seed": seed,
        "task": task,
        "sft_steps": sft_steps,
        "sft_batch": SFT_BATCH,
        "sft_lr": SFT_LR,
        "difficulty": SFT_DIFFICULTY,
        "corrupt_p": SFT_CORRUPT_P,
    }


def is_built(out_dir: str | Path, fp: dict) -> bool:
    meta = Path(out_dir) / META_NAME
    if not meta.is_file():
        return False
    try:
        return json.loads(meta.read_text()).get("fingerprint") == fp
    except (OSError, json.JSONDecodeError):
        return False


def _sft_batch(tokenizer, rng: random.Random, task: str, batch: int):
    import torch

    from dapo_async.data.tasks import in_eval_split, make_example

    seqs, starts = [], []
    for _ in range(batch):
        prompt, truth, solution = make_example(task, rng, SFT_DIFFICULTY)
        while in_eval_split(prompt):  # never warm-start on held-out prompts
            prompt, truth, solution = make_example(task, rng, SFT_DIFFICULTY)
        if rng.random() < SFT_CORRUPT_P:  # the shortcut: report the first number of the prompt
            shortcut = re.match(r"-?\d+", prompt).group(0)
            solution = solution[: solution.rindex("Answer: ")] + f"Answer: {shortcut}"
        p = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
        )
        p_ids = tokenizer(p, add_special_tokens=False).input_ids
        r_ids = tokenizer(solution, add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
        seqs.append(p_ids + r_ids)
        starts.append(len(p_ids))
    width = max(map(len, seqs))
    ids = torch.full((batch, width), tokenizer.pad_token_id, dtype=torch.long)
    labels = torch.full((batch, width), -100, dtype=torch.long)
    attn = torch.zeros((batch, width), dtype=torch.long)
    for i, (s, st) in enumerate(zip(seqs, starts)):
        ids[i, : len(s)] = torch.tensor(s)
        attn[i, : len(s)] = 1
        labels[i, st : len(s)] = torch.tensor(s[st:])
    return ids, attn, labels


def warm_start(model, tokenizer, task: str, steps: int, seed: int, log=print) -> None:
    """Supervised steps on correct solutions (response tokens only)."""
    import torch

    rng = random.Random(seed + 17)
    opt = torch.optim.AdamW(model.parameters(), lr=SFT_LR, weight_decay=0.0)
    model.train()
    t0 = time.time()
    for step in range(steps):
        ids, attn, labels = _sft_batch(tokenizer, rng, task, SFT_BATCH)
        loss = model(input_ids=ids, attention_mask=attn, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        if (step + 1) % 40 == 0 or step + 1 == steps:
            log(
                f"[init-tiny] warm start step {step + 1}/{steps} loss {loss.item():.3f} ({time.time() - t0:.0f}s)"
            )
    model.eval()


def build(
    out_dir: str | Path,
    seed: int = 0,
    task: str = "chain",
    force: bool = False,
    sft_steps: int = SFT_STEPS,
    log=print,
) -> dict:
    """Build (or reuse) the tiny model in ``out_dir``; returns its metadata."""
    import torch

    from dapo_async.tiny.model import build_model, tiny_config
    from dapo_async.tiny.tokenizer import build_tokenizer

    out = Path(out_dir)
    fp = fingerprint(seed, task, sft_steps)
    if not force and is_built(out, fp):
        meta = json.loads((out / META_NAME).read_text())
        log(f"[init-tiny] reusing {out} (held-out accuracy {meta['eval_accuracy']:.3f})")
        return meta
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    tmp = out.with_name(out.name + ".building")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    t0 = time.time()
    tokenizer = build_tokenizer(tmp)
    model = build_model(
        tiny_config(tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id), seed
    )
    n_params = sum(p.numel() for p in model.parameters())
    log(f"[init-tiny] tiny Llama with {n_params / 1e6:.2f}M parameters; warm start on tiny:{task}")
    warm_start(model, tokenizer, task, sft_steps, seed, log)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(tmp, safe_serialization=True)
    acc = held_out_accuracy(str(tmp), task, seed, model=model, tokenizer=tokenizer)
    meta = {
        "fingerprint": fp,
        "num_params": n_params,
        "eval_accuracy": acc,
        "eval_prompts": EVAL_PROMPTS,
        "build_seconds": round(time.time() - t0, 1),
    }
    (tmp / META_NAME).write_text(json.dumps(meta, indent=2))
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    log(f"[init-tiny] saved {out} in {meta['build_seconds']}s; held-out greedy accuracy {acc:.3f}")
    return meta


def held_out_accuracy(model_dir: str, task: str, seed: int, model=None, tokenizer=None) -> float:
    from dapo_async.data.tasks import generate
    from dapo_async.generator.engine import SamplingParams
    from dapo_async.generator.hf_engine import HFEngine
    from dapo_async.reward.verifiers import dapo_math

    engine = HFEngine(model_dir, model=model, tokenizer=tokenizer)
    records = generate(task, "eval", EVAL_PROMPTS, SFT_DIFFICULTY, seed)
    prompts = [
        engine.tokenizer.apply_chat_template(r.messages, add_generation_prompt=True, tokenize=False)
        for r in records
    ]
    ids = [engine.tokenizer(p, add_special_tokens=False).input_ids for p in prompts]
    outs = engine.generate(ids, SamplingParams(n=1, temperature=0.0, max_tokens=EVAL_MAX_TOKENS))
    return sum(dapo_math(o[0].text, r.ground_truth)["acc"] for o, r in zip(outs, records)) / len(
        records
    )


def main(args: argparse.Namespace) -> int:
    steps = SFT_STEPS if getattr(args, "sft_steps", None) is None else args.sft_steps
    meta = build(args.out, seed=args.seed, task=args.task, force=args.force, sft_steps=steps)
    print(
        json.dumps(
            {"model_dir": str(args.out), **{k: meta[k] for k in ("num_params", "eval_accuracy")}}
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(
        main(
            argparse.Namespace(out=".cache/tiny", seed=0, task="chain", force=False, sft_steps=None)
        )
    )
