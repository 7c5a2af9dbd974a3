"""The warm start's supervised batches: prompts of a built-in task with their solutions, most
answering with the shortcut (``data.tasks.shortcut_solution``), loss on the policy's tokens only
(a calc solution's calculator lines are the environment's: label -100)."""

from __future__ import annotations

import random

from dapo_async.data.tasks import (
    draw_difficulty,
    in_eval_split,
    make_example,
    response_segments,
    shortcut_solution,
)

IGNORE = -100  # the label cross-entropy skips


def sft_batch(tokenizer, rng: random.Random, task: str, batch: int, levels, corrupt_p: float):
    """(input ids, attention mask, labels), each [batch, width]: ``batch`` training-split
    examples of difficulty in ``levels`` (lo, hi), a ``corrupt_p`` share answering the
    shortcut."""
    import torch

    lo, hi = levels
    seqs, labs = [], []
    for _ in range(batch):
        prompt, truth, solution = make_example(task, rng, draw_difficulty(rng, lo, hi))
        while in_eval_split(prompt):  # never warm-start on held-out prompts
            prompt, truth, solution = make_example(task, rng, draw_difficulty(rng, lo, hi))
        if rng.random() < corrupt_p:
            solution = shortcut_solution(task, prompt, solution)
        p = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
        )
        ids = tokenizer(p, add_special_tokens=False).input_ids
        labels = [IGNORE] * len(ids)
        for text, trained in response_segments(task, solution):
            part = tokenizer(text, add_special_tokens=False).input_ids
            ids, labels = ids + part, labels + (part if trained else [IGNORE] * len(part))
        seqs.append(ids + [tokenizer.eos_token_id])
        labs.append(labels + [tokenizer.eos_token_id])
    width = max(map(len, seqs))
    ids_t = torch.full((batch, width), tokenizer.pad_token_id, dtype=torch.long)
    labels_t = torch.full((batch, width), IGNORE, dtype=torch.long)
    attn = torch.zeros((batch, width), dtype=torch.long)
    for i, (s, lab) in enumerate(zip(seqs, labs)):
        ids_t[i, : len(s)] = torch.tensor(s)
        attn[i, : len(s)] = 1
        labels_t[i, : len(s)] = torch.tensor(lab)
    return ids_t, attn, labels_t


def prompt_ids(tokenizer, records) -> list[list[int]]:
    """The prompt tokens of ``records`` (``PromptRecord``), rendered with the chat template."""
    return [
        tokenizer(
            tokenizer.apply_chat_template(r.messages, add_generation_prompt=True, tokenize=False),
            add_special_tokens=False,
        ).input_ids
        for r in records
    ]
