"""Held-out evaluation: avg@k and pass@k with the DAPO verifier, shared by the learner's periodic
evaluation and `dapo-async eval`.

avg@k = mean accuracy over k samples of every prompt; pass@k = fraction of prompts with at least
one correct sample. With ``generator.eval_temperature`` 0 (greedy) k is 1.
"""

from __future__ import annotations

import numpy as np

from dapo_async.data.prompts import PromptRenderer
from dapo_async.data.tasks import PromptRecord

# Prompts per engine call during evaluation (bounds memory).
EVAL_BATCH = 64


def evaluate_records(
    model, tokenizer, cfg, records: list[PromptRecord], k: int | None = None, progress=None
) -> dict[str, float]:
    from dapo_async.engines.base import SamplingParams
    from dapo_async.engines.hf import HFEngine
    from dapo_async.reward.compose import call_verifier, resolve

    g = cfg.generator
    greedy = g.eval_temperature == 0
    k = 1 if greedy else (k or 4)
    device = next(model.parameters()).device  # evaluate where the model lives
    engine = HFEngine("", model=model, tokenizer=tokenizer, device=str(device))
    verifier = resolve(cfg.reward.fn)
    renderer = PromptRenderer.from_config(tokenizer, cfg.data)  # the buffer's prompt path
    params = SamplingParams(
        n=k,
        temperature=g.eval_temperature,
        top_p=g.eval_top_p,
        max_tokens=g.max_tokens,
        seed=cfg.seed,
    )
    was_training = model.training
    model.eval()
    acc = np.zeros((len(records), k))
    lengths = []
    for start in range(0, len(records), EVAL_BATCH):
        chunk = records[start : start + EVAL_BATCH]
        texts = [renderer.render(r.messages) for r in chunk]
        ids = [renderer.encode(r.messages) for r in chunk]
        for i, (r, comps) in enumerate(zip(chunk, engine.generate(ids, params))):
            for j, c in enumerate(comps):
                # any documented form: a bare float, a dict; two or four arguments
                verdict = call_verifier(verifier, c.text, r.ground_truth, texts[i], r.extra)
                acc[start + i, j] = verdict["acc"]
                lengths.append(len(c.tokens))
        if progress is not None:
            progress(min(start + EVAL_BATCH, len(records)), len(records))
    if was_training:
        model.train()
    return {
        "eval/accuracy": float(acc.mean()) if len(records) else 0.0,
        "eval/pass_at_k": float((acc.max(axis=1) > 0).mean()) if len(records) else 0.0,
        "eval/k": float(k),
        "eval/num_prompts": float(len(records)),
        "eval/response_len_mean": float(np.mean(lengths)) if lengths else 0.0,
    }
