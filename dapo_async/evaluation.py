"""Held-out evaluation: avg@k and pass@k, overall and per ``data_source``, shared by the learner's
periodic evaluation and `dapo-async eval` (transformers or vLLM engine).

avg@k = mean accuracy over k samples of every prompt; pass@k = fraction of prompts with at least
one correct sample. With ``generator.eval_temperature`` 0 (greedy) k is 1. Prompts go through the
same renderer as training (``data/prompts.py``); responses are scored by ``reward.fn`` in any of
its documented forms.
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
    """Evaluate an in-memory transformers model (the learner's) with the hf engine."""
    from dapo_async.engines.hf import HFEngine

    device = next(model.parameters()).device  # evaluate where the model lives
    engine = HFEngine("", model=model, tokenizer=tokenizer, device=str(device))
    was_training = model.training
    model.eval()
    try:
        return evaluate_engine(engine, tokenizer, cfg, records, k, progress)
    finally:
        if was_training:
            model.train()


def evaluate_engine(
    engine, tokenizer, cfg, records: list[PromptRecord], k: int | None = None, progress=None
) -> dict[str, float]:
    """avg@k / pass@k of ``engine`` (anything with ``generate(prompt ids, params)``)."""
    from dapo_async.engines.base import SamplingParams
    from dapo_async.reward.compose import call_verifier, resolve

    g = cfg.generator
    greedy = g.eval_temperature == 0
    k = 1 if greedy else (k or 4)
    verifier = resolve(cfg.reward.fn)
    renderer = PromptRenderer.from_config(tokenizer, cfg.data)  # the buffer's prompt path
    params = SamplingParams(
        n=k,
        temperature=g.eval_temperature,
        top_p=g.eval_top_p,
        max_tokens=g.max_tokens,
        seed=cfg.seed,
    )
    acc = np.zeros((len(records), k))
    lengths = []
    for start in range(0, len(records), EVAL_BATCH):
        chunk = records[start : start + EVAL_BATCH]
        texts = [renderer.render(r.messages) for r in chunk]
        ids = [renderer.tokenize(t) for t in texts]  # rendered once, above
        for i, (r, comps) in enumerate(zip(chunk, engine.generate(ids, params))):
            for j, c in enumerate(comps):
                # any documented form: a bare float, a dict; two or four arguments
                verdict = call_verifier(verifier, c.text, r.ground_truth, texts[i], r.extra)
                acc[start + i, j] = verdict["acc"]
                lengths.append(len(c.tokens))
        if progress is not None:
            progress(min(start + EVAL_BATCH, len(records)), len(records))
    out = _summary(acc, k)
    out["eval/response_len_mean"] = float(np.mean(lengths)) if lengths else 0.0
    for source in sorted({r.data_source for r in records}):
        rows = np.array([r.data_source == source for r in records])
        if len(rows) and rows.sum() < len(records):  # per source only where there are several
            per = _summary(acc[rows], k)
            out[f"eval/{source}/accuracy"] = per["eval/accuracy"]
            out[f"eval/{source}/pass_at_k"] = per["eval/pass_at_k"]
    return out


def _summary(acc: np.ndarray, k: int) -> dict[str, float]:
    n = len(acc)
    return {
        "eval/accuracy": float(acc.mean()) if n else 0.0,
        "eval/pass_at_k": float((acc.max(axis=1) > 0).mean()) if n else 0.0,
        "eval/k": float(k),
        "eval/num_prompts": float(n),
    }
