"""`dapo-async init-tiny`: build, warm-start and cache the built-in tiny policy.

Steps: character tokenizer → tiny Llama (seeded) → a supervised warm start on solutions of a
synthetic task, most of which report a shortcut answer → save as a normal HF model directory →
held-out greedy accuracy. The directory holds ``tiny_meta.json`` with a fingerprint of
everything that shaped it and the figures the warm start stopped at; a second call with the same
arguments reuses it.

The warm start ends at a measured state, not at a step count: every ``CHECK_EVERY`` steps it
decodes ``CHECK_PROMPTS`` held-out prompts greedily and stops once the share whose every
intermediate step is right (``steps_ok``, whatever final answer they report) reaches
``STEPS_OK_TARGET``. Floating point differs between CPUs, so the step at which a small model
learns the arithmetic moves from machine to machine; the state it stops at does not. Because 70%
of the warm-start answers are the shortcut (the prompt's first number), the policy then works
the steps right but mostly reports the shortcut: held-out accuracy starts low and RL has a clear
signal (the sampled answers that report the worked result are rewarded).

torch, transformers and the hf engine are imported inside the functions that use them: the
launcher imports this module to build the policy on demand and must not load torch otherwise.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import re
import shutil
import sys
import time
from pathlib import Path

from dapo_async.data.tasks import generate, steps_correct
from dapo_async.engines.base import SamplingParams
from dapo_async.reward.verifiers import dapo_math_lenient, extract_answer
from dapo_async.tiny.sft_data import prompt_ids, sft_batch
from dapo_async.tiny.tokenizer import build_tokenizer

META_NAME = "tiny_meta.json"
BUILD_VERSION = 6  # 6: BUILD_THREADS always (5 followed OMP_NUM_THREADS)
SFT_BATCH = 64
SFT_LR = 3e-3
# Linear warm-up of the warm start's learning rate. AdamW at the full rate from step 0 stalled
# the learning of the steps for hundreds of steps, by an amount that differed between CPUs
# (measured: steps learned near step 200 with warm-up, 550-900+ without, on the same machine).
SFT_WARMUP_STEPS = 100
# Step cap of the criterion-driven warm start; the learning rate decays (cosine) over this
# horizon to SFT_MIN_LR_FRAC of its peak, so late checks see a settled model, not Adam noise.
SFT_MAX_STEPS = 2000
SFT_MIN_LR_FRAC = 0.05
# Criterion: checked every CHECK_EVERY steps (about 1.5 s of greedy decoding each time) on
# CHECK_PROMPTS held-out prompts, drawn with their own seed offset.
CHECK_EVERY = 50
CHECK_PROMPTS = 128
CHECK_SEED_OFFSET = 500_009
STEPS_OK_TARGET = 0.9
# Default warm-start difficulty (the main job's tiny:chain difficulty).
SFT_DIFFICULTY = 3
# Fraction of warm-start solutions whose final "Answer:" reports a shortcut (the prompt's first
# number) instead of the worked-out result: the policy computes the steps but mostly reports the
# shortcut, so RL starts from low accuracy with a clear signal to learn from (docs/quickstart.md).
SFT_CORRUPT_P = 0.7
EVAL_PROMPTS = 256
# Torch threads of every build, whatever OMP_NUM_THREADS or the core count: the thread count
# splits the matmuls' sums, so it decides the warm start's rounding (on one CPU, seed 0 met the
# criterion after 300 steps at 1 thread and after 200 at 2; docs/results.md). Fixed, one CPU
# builds one tiny policy. More than 2 gains nothing at this size.
BUILD_THREADS = 2
# Response budget of the warm start's own decoding: a chain solution is 6 tokens a step plus
# "Answer: X" and EOS; the margin lets a wrong, longer answer show as wrong rather than cut.
TOKENS_PER_STEP, ANSWER_TOKENS, DECODE_MARGIN = 6, 10, 6


class WarmStartError(RuntimeError):
    """The warm start hit its step cap before its criterion; the message names the figures."""


def decode_budget(task: str, difficulty: int, max_difficulty: int) -> int:
    hardest = max(difficulty, max_difficulty)
    if task == "calc":  # "CALL a*b\n" + "Answer: " + the product + EOS, sampled
        return 4 * hardest + 16 + DECODE_MARGIN
    per_step = TOKENS_PER_STEP if task == "chain" else 0
    return per_step * hardest + ANSWER_TOKENS + DECODE_MARGIN + (hardest if task == "arith" else 0)


def fingerprint(
    seed: int, task: str, sft_steps: int | None, difficulty: int, max_difficulty: int
) -> dict:
    return {
        "build_version": BUILD_VERSION,
        "seed": seed,
        "task": task,
        "difficulty": difficulty,
        "max_difficulty": max_difficulty,
        # None: until the criterion (steps_ok >= target, cap max_steps); an int: exactly that
        "sft_steps": sft_steps,
        "steps_ok_target": STEPS_OK_TARGET,
        "max_steps": SFT_MAX_STEPS,
        "sft_batch": SFT_BATCH,
        "sft_lr": SFT_LR,
        "warmup_steps": SFT_WARMUP_STEPS,
        "corrupt_p": SFT_CORRUPT_P,
    }


def _reuse(out: Path, log) -> dict:
    meta = json.loads((out / META_NAME).read_text())
    log(f"[init-tiny] reusing {out} (held-out accuracy {meta['eval_accuracy']:.3f})")
    return meta


def is_built(out_dir: str | Path, fp: dict) -> bool:
    meta = Path(out_dir) / META_NAME
    if not meta.is_file():
        return False
    try:
        return json.loads(meta.read_text()).get("fingerprint") == fp
    except (OSError, json.JSONDecodeError):
        return False


def cpu_model() -> str:
    """The CPU's model name (figures name the machine they were measured on)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def lr_factor(step: int, horizon: int) -> float:
    """Linear warm-up, then cosine decay to SFT_MIN_LR_FRAC at ``horizon``."""
    if step < SFT_WARMUP_STEPS:
        return (step + 1) / SFT_WARMUP_STEPS
    frac = min(1.0, (step - SFT_WARMUP_STEPS) / max(1, horizon - SFT_WARMUP_STEPS))
    return SFT_MIN_LR_FRAC + (1 - SFT_MIN_LR_FRAC) * 0.5 * (1 + math.cos(math.pi * frac))


def greedy_figures(model, tokenizer, task: str, records, max_tokens: int) -> dict[str, float]:
    """Greedy decoding of ``records``: accuracy, steps_ok (every step right) and shortcut_rate
    (the answer reported is the prompt's first number)."""
    from dapo_async.engines.hf import HFEngine

    if task == "calc":  # a multi-turn task: its episodes, with the tool (tiny/calc.py)
        from dapo_async.tiny.calc import check_figures

        return check_figures(model, tokenizer, records, max_tokens)
    was_training = model.training
    engine = HFEngine("", model=model, tokenizer=tokenizer)
    ids = prompt_ids(tokenizer, records)
    outs = engine.generate(ids, SamplingParams(n=1, temperature=0.0, max_tokens=max_tokens))
    acc = ok = shortcut = 0
    for out, rec in zip(outs, records):
        text, prompt = out[0].text, rec.messages[0]["content"]
        # the lenient rules, as when the cached tiny policies were built (the warm start's
        # stopping point must not move); on this task's outputs both rule sets agree
        acc += dapo_math_lenient(text, rec.ground_truth)["acc"]
        ok += steps_correct(task, prompt, text)
        shortcut += (extract_answer(text, lenient=True) or "").strip() == re.match(
            r"-?\d+", prompt
        ).group(0)
    model.train(was_training)
    n = max(1, len(records))
    return {"accuracy": acc / n, "steps_ok": ok / n, "shortcut_rate": shortcut / n}


def warm_start(
    model,
    tokenizer,
    task: str,
    seed: int,
    difficulty: int = SFT_DIFFICULTY,
    max_difficulty: int = 0,
    sft_steps: int | None = None,
    log=print,
) -> dict:
    """Supervised steps on (mostly shortcut-answered) solutions, response tokens only.

    ``sft_steps=None``: until held-out ``steps_ok`` >= STEPS_OK_TARGET, checked every
    CHECK_EVERY steps, at most SFT_MAX_STEPS (then WarmStartError); an int: exactly that many
    steps, no criterion (tests). Returns the stopping figures and the history of checks."""
    import torch

    rng = random.Random(seed + 17)
    check_records = generate(
        task, "eval", CHECK_PROMPTS, difficulty, seed + CHECK_SEED_OFFSET, max_difficulty
    )
    budget = decode_budget(task, difficulty, max_difficulty)
    horizon = SFT_MAX_STEPS if sft_steps is None else max(sft_steps, 1)
    opt = torch.optim.AdamW(model.parameters(), lr=SFT_LR, weight_decay=0.0)
    model.train()
    t0 = time.time()
    history: list[dict] = []
    figures: dict = {}
    step = 0
    while step < horizon:
        loss = _sft_step(
            model, opt, tokenizer, rng, task, (difficulty, max_difficulty), step, horizon
        )
        step += 1
        if step % CHECK_EVERY and step != horizon:
            continue
        figures = {"step": step, "loss": round(loss, 4)}
        figures |= greedy_figures(model, tokenizer, task, check_records, budget)
        history.append(figures)
        log(_check_line(figures, time.time() - t0))
        if sft_steps is None and figures["steps_ok"] >= STEPS_OK_TARGET:
            break
    model.eval()
    if sft_steps is None and figures.get("steps_ok", 0.0) < STEPS_OK_TARGET:
        raise WarmStartError(_missed_message(history))
    return {"sft_steps_run": step, "criterion": figures, "checks": history}


def _sft_step(
    model, opt, tokenizer, rng, task: str, levels: tuple[int, int], step: int, horizon: int
):
    """One supervised step at the scheduled learning rate; returns the loss."""
    for group in opt.param_groups:
        group["lr"] = SFT_LR * lr_factor(step, horizon)
    lo, hi = levels
    ids, attn, labels = sft_batch(tokenizer, rng, task, SFT_BATCH, (lo, max(lo, hi)), SFT_CORRUPT_P)
    loss = model(input_ids=ids, attention_mask=attn, labels=labels).loss
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss.item()


def _check_line(figures: dict, seconds: float) -> str:
    return (
        f"[init-tiny] warm start step {figures['step']}: loss {figures['loss']:.3f}, steps right "
        f"{figures['steps_ok']:.2f} (target {STEPS_OK_TARGET}), answer = shortcut "
        f"{figures['shortcut_rate']:.2f}, accuracy {figures['accuracy']:.2f} ({seconds:.0f}s)"
    )


def _missed_message(history: list[dict]) -> str:
    last, best = history[-1], max(history, key=lambda h: h["steps_ok"])
    return (
        f"the warm start did not reach its criterion: held-out steps right "
        f"{last['steps_ok']:.2f} after {last['step']} steps (target {STEPS_OK_TARGET}; best "
        f"{best['steps_ok']:.2f} at step {best['step']}, loss {last['loss']:.3f}). "
        "Try another seed (`dapo-async init-tiny --seed N`, or model.tiny_seed=N) and "
        "report the figures above with your CPU model."
    )


def build(
    out_dir: str | Path,
    seed: int = 0,
    task: str = "chain",
    force: bool = False,
    sft_steps: int | None = None,
    difficulty: int = SFT_DIFFICULTY,
    max_difficulty: int = 0,
    log=print,
) -> dict:
    """Build (or reuse) the tiny model in ``out_dir``; returns its metadata. ``sft_steps=None``
    warm-starts until the criterion (see the module docstring), at ``BUILD_THREADS`` torch
    threads (the caller's count is restored after)."""
    import torch

    out = Path(out_dir)
    max_difficulty = max_difficulty if max_difficulty > difficulty else 0
    fp = fingerprint(seed, task, sft_steps, difficulty, max_difficulty)
    if not force and is_built(out, fp):
        return _reuse(out, log)
    caller_threads = torch.get_num_threads()
    torch.set_num_threads(BUILD_THREADS)
    try:
        meta = _build(out, fp, seed, task, sft_steps, difficulty, max_difficulty, log)
    finally:
        torch.set_num_threads(caller_threads)
    return meta


def _build(
    out: Path,
    fp: dict,
    seed: int,
    task: str,
    sft_steps: int | None,
    difficulty: int,
    max_difficulty: int,
    log,
) -> dict:
    import torch

    from dapo_async.tiny.model import build_model, tiny_config

    tmp = out.with_name(out.name + ".building")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    t0 = time.time()
    tokenizer = build_tokenizer(tmp)
    model = build_model(
        tiny_config(tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id), seed
    )
    n_params = sum(p.numel() for p in model.parameters())
    levels = f"{difficulty}" if not max_difficulty else f"{difficulty}-{max_difficulty}"
    log(
        f"[init-tiny] tiny Llama with {n_params / 1e6:.2f}M parameters; warm start on "
        f"tiny:{task} (difficulty {levels}, seed {seed}) until {STEPS_OK_TARGET:.0%} of "
        "held-out prompts have every step right"
    )
    ws = warm_start(model, tokenizer, task, seed, difficulty, max_difficulty, sft_steps, log)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(tmp, safe_serialization=True)
    held_out = held_out_figures(model, tokenizer, task, seed, difficulty, max_difficulty)
    meta = {
        "fingerprint": fp,
        "num_params": n_params,
        **{f"eval_{k}": v for k, v in held_out.items()},
        "eval_prompts": EVAL_PROMPTS,
        **ws,
        "cpu_model": cpu_model(),
        "torch_threads": torch.get_num_threads(),
        "build_seconds": round(time.time() - t0, 1),
    }
    _install(tmp, out, meta)
    log(
        f"[init-tiny] saved {out} in {meta['build_seconds']}s after {ws['sft_steps_run']} steps; "
        f"held-out greedy accuracy {held_out['accuracy']:.3f}, steps right "
        f"{held_out['steps_ok']:.3f}, shortcut answers {held_out['shortcut_rate']:.3f}"
    )
    return meta


def _install(tmp: Path, out: Path, meta: dict) -> None:
    """Write the metadata and move the finished build into place (a crash leaves the old
    directory or none, never a half-written one under ``out``)."""
    (tmp / META_NAME).write_text(json.dumps(meta, indent=2))
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)


def held_out_figures(
    model, tokenizer, task: str, seed: int, difficulty: int, max_difficulty: int = 0
) -> dict[str, float]:

    records = generate(task, "eval", EVAL_PROMPTS, difficulty, seed, max_difficulty)
    budget = decode_budget(task, difficulty, max_difficulty)
    return greedy_figures(model, tokenizer, task, records, budget)


def main(args: argparse.Namespace) -> int:
    try:
        options = ("seed", "task", "force", "sft_steps", "difficulty", "max_difficulty")
        meta = build(args.out, **{name: getattr(args, name) for name in options})
    except WarmStartError as e:
        print(f"init-tiny: {e}", file=sys.stderr)
        return 1
    keys = ("num_params", "eval_accuracy", "eval_steps_ok", "eval_shortcut_rate")
    print(json.dumps({"model_dir": str(args.out), **{k: meta[k] for k in keys}}))
    return 0
