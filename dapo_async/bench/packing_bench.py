"""`dapo-async bench packing`: learner tokens/s with and without sequence packing, in one run.

The same learner steps (proximal pass, K mini-batch updates) on the same long-tail batches —
most responses short, a few long, as RL rollouts are — once with padded micro-batches (every
row padded to the longest of its micro-batch) and once packed (``learner.pack_sequences``: the
responses end to end, nothing padded). Rounds alternate the two (``--rounds``) so drift on a
shared machine hits both; the figure is trained response tokens per second of step time.
The model is the tiny policy's architecture with random weights (nothing to download or build).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from dapo_async.bench.common import print_result
from dapo_async.protocol import Group

# The batch: a long tail of response lengths (most short, some long), as in RL rollouts.
NUM_GROUPS, GROUP_SIZE = 16, 4
SHORT, LONG, LONG_SHARE = (8, 24), (96, 160), 0.15
PROMPT_LEN = (12, 24)
VOCAB_LOW, VOCAB_HIGH = 10, 60  # printable ids of the tiny vocabulary


def longtail_groups(seed: int) -> list[Group]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(NUM_GROUPS):
        long = rng.random(GROUP_SIZE) < LONG_SHARE
        lens = np.where(long, rng.integers(*LONG, GROUP_SIZE), rng.integers(*SHORT, GROUP_SIZE))
        t = int(lens.sum())
        acc = (rng.random(GROUP_SIZE) < 0.5).astype(np.float32)
        acc[0], acc[1] = 1.0, 0.0
        out.append(
            Group(
                generator_id="bench",
                seq=seed * 1000 + i,
                prompt_id=i,
                prompt_tokens=rng.integers(
                    VOCAB_LOW, VOCAB_HIGH, int(rng.integers(*PROMPT_LEN))
                ).astype(np.int32),
                response_lens=lens.astype(np.int32),
                tokens=rng.integers(VOCAB_LOW, VOCAB_HIGH, t).astype(np.int32),
                logprobs=rng.uniform(-4.5, -3.5, t).astype(np.float32),
                versions=np.zeros(t, np.int32),
                rewards=np.where(acc > 0, 1.0, -1.0).astype(np.float32),
                acc=acc,
                components=np.zeros((GROUP_SIZE, 1), np.float32),
                finish=np.zeros(GROUP_SIZE, np.uint8),
            )
        )
    return out


def _trainer(pack: bool, micro_batch_tokens: int):
    from dapo_async.config import load_config
    from dapo_async.learner.parallel import Parallel
    from dapo_async.learner.trainer import Trainer
    from dapo_async.tiny.model import build_model, tiny_config

    cfg = load_config(
        None,
        [
            f"learner.pack_sequences={pack}",
            f"learner.micro_batch_tokens={micro_batch_tokens}",
            "learner.num_minibatches=2",
            "generator.max_tokens=160",
            "generator.max_model_len=256",
        ],
    )
    model = build_model(tiny_config(1, 2, 0), seed=0)
    g = cfg.generator
    return Trainer(
        Parallel(model),
        cfg.algo,
        cfg.learner,
        pad_id=0,
        temperature=g.temperature,
        max_tokens=g.max_tokens,
    )


def main(args: argparse.Namespace) -> int:
    torch.set_num_threads(1)
    budget = 2048
    trainers = {False: _trainer(False, budget), True: _trainer(True, budget)}
    batches = [longtail_groups(s) for s in range(max(args.rounds, 1))]
    tokens = sum(g.num_tokens for g in batches[0])
    for pack in (False, True):  # warm-up, uncounted
        trainers[pack].step(batches[0])
    seconds = {False: 0.0, True: 0.0}
    trained = {False: 0, True: 0}
    for groups in batches:  # the two alternate within each round
        for pack in (False, True):
            t0 = time.perf_counter()
            trainers[pack].step(groups)
            seconds[pack] += time.perf_counter() - t0
            trained[pack] += sum(g.num_tokens for g in groups)
    padded = trained[False] / max(seconds[False], 1e-9)
    packed = trained[True] / max(seconds[True], 1e-9)
    out = {
        "rounds": len(batches),
        "tokens_per_batch": tokens,
        "micro_batch_tokens": budget,
        "padded_tokens_per_s": round(padded, 1),
        "packed_tokens_per_s": round(packed, 1),
        "packing_speedup": round(packed / max(padded, 1e-9), 3),
    }
    summary = (
        f"[bench packing] padded {padded:.0f} tok/s, packed {packed:.0f} tok/s: "
        f"{out['packing_speedup']:.2f}x"
    )
    return print_result(summary, out, args.json)
