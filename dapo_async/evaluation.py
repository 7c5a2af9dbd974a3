"""Held-out evaluation: avg@k and pass@k, overall and per ``data_source``, shared by the learner's
periodic evaluation and `dapo-async eval` (transformers or vLLM engine).

avg@k = mean accuracy over the samples of every prompt; pass@k = the unbiased estimate (Chen et al.
2021) of the chance that k samples hold a correct one, from all samples of the prompt. The
``eval`` config section sets k (1 with ``eval.temperature`` 0: greedy), top-p and the length. Rows repeating a prompt
are folded into one prompt sampled repeats × k times and weighted by its repeats. Prompts go through the
same renderer as training (``data/prompts.py``); responses are scored by ``reward.fn`` in any of
its documented forms.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dapo_async.data.datasets import group_repeats
from dapo_async.data.prompts import PromptRenderer
from dapo_async.data.tasks import PromptRecord
from dapo_async.rollouts import EpisodeRunner, Sample, info_means, load_rollout

# Prompts per engine call during evaluation (bounds memory).
EVAL_BATCH = 64


def evaluate_records(
    model, tokenizer, cfg, records: list[PromptRecord], k: int | None = None, progress=None
) -> dict[str, float]:
    """Evaluate an in-memory transformers model (the learner's) with the hf engine, where it
    lives, computing in the generators' dtype (``generator.dtype``: bfloat16 on a GPU) rather
    than the learner's fp32 master weights."""
    import contextlib

    import torch

    from dapo_async.devices import resolve_dtype
    from dapo_async.engines.hf import HFEngine

    param = next(model.parameters())
    device = param.device  # evaluate where the model lives
    engine = HFEngine("", model=model, tokenizer=tokenizer, device=str(device))
    dtype = resolve_dtype(cfg.generator.dtype, device)
    lower = device.type in ("cuda", "cpu") and dtype.itemsize < param.dtype.itemsize
    cast = torch.autocast(device.type, dtype=dtype) if lower else contextlib.nullcontext()
    was_training = model.training
    model.eval()
    try:
        with cast:
            return evaluate_engine(engine, tokenizer, cfg, records, k, progress)
    finally:
        if was_training:
            model.train()


def eval_engine(cfg, model_dir: str, engine: str | None = None, share_gpu: bool = False):
    """The engine held-out evaluation runs on: ``engine``, else ``eval.engine`` (auto: the
    generators' ``generator.engine``), in ``generator.dtype`` on this process's device (a GPU
    when one is visible). ``share_gpu``: the evaluator role beside a generator on its GPU —
    vLLM then takes ``eval.gpu_memory_utilization`` of it."""
    import dataclasses

    from dapo_async.engines import make_engine

    kind = engine or cfg.eval.resolved_engine(cfg.generator)
    if kind == "vllm":
        g = dataclasses.replace(cfg.generator, mode="batch")  # no in-flight updates here
        if share_gpu:
            g = dataclasses.replace(g, gpu_memory_utilization=cfg.eval.gpu_memory_utilization)
        cfg = dataclasses.replace(cfg, generator=g)
    return make_engine(kind, model_dir, cfg.generator.dtype, cfg, seed=cfg.seed)


def evaluate_engine(
    engine, tokenizer, cfg, records: list[PromptRecord], k: int | None = None, progress=None
) -> dict[str, float]:
    """avg@k / pass@k of ``engine`` (anything with ``generate(prompt ids, params)``). Rows that
    repeat a prompt (an eval file repeated 32 times for avg@32) are folded: the prompt is
    rendered once and sampled repeats × k times, weighted by its repeats."""
    from dapo_async.engines.base import SamplingParams

    e = cfg.eval
    greedy = e.temperature == 0
    k = 1 if greedy else (k or e.k)
    renderer = PromptRenderer.from_config(tokenizer, cfg.data)  # the buffer's prompt path
    params = SamplingParams(
        n=k,
        temperature=e.temperature,
        top_p=e.top_p,
        max_tokens=e.resolved_max_tokens(cfg.generator),
        seed=cfg.seed,
    )
    folded = group_repeats(records)
    stats: list[PromptStats] = []
    lengths: list[int] = []
    # episodes as the generators play them (generator.rollout; default: one response each)
    runner = EpisodeRunner(load_rollout(cfg.generator.rollout), engine, params, tokenizer)
    infos: list = []
    for start in range(0, len(folded), EVAL_BATCH):
        chunk = folded[start : start + EVAL_BATCH]
        texts = [renderer.render(r.messages) for r, _ in chunk]
        ids = [renderer.tokenize(t) for t in texts]  # rendered once, above
        by_n: dict[int, list[int]] = {}  # samples per prompt -> prompts of the chunk
        for i, (_, repeats) in enumerate(chunk):
            by_n.setdefault(1 if greedy else repeats * k, []).append(i)  # greedy: all alike
        scored: dict[int, PromptStats] = {}
        for n, idx in by_n.items():
            outs = _episodes(runner, [ids[i] for i in idx], [chunk[i][0] for i in idx], n)
            infos += [c for comps in outs for c in comps]
            for i, comps in zip(idx, outs):
                record, repeats = chunk[i]
                scored[i] = _score(cfg, record, repeats, texts[i], comps, lengths)
        stats += [scored[i] for i in range(len(chunk))]
        if progress is not None:
            progress(min(start + EVAL_BATCH, len(folded)), len(folded))
    out = _summary(stats, k)
    out["eval/response_len_mean"] = float(np.mean(lengths)) if lengths else 0.0
    out.update({f"eval/rollout/{k}": v for k, v in info_means(infos).items()})
    for source in sorted({s.record.data_source for s in stats}):
        part = [s for s in stats if s.record.data_source == source]
        if len(part) < len(stats):  # per source only where there are several
            per = _summary(part, k)
            out[f"eval/{source}/accuracy"] = per["eval/accuracy"]
            out[f"eval/{source}/pass_at_k"] = per["eval/pass_at_k"]
    return out


def _episodes(runner, ids: list[list[int]], records: list[PromptRecord], n: int) -> list[list]:
    """``n`` episodes of each prompt (completions, in prompt order)."""
    samples = [
        Sample(p, r.ground_truth, extra=dict(r.extra), index=j)
        for p, r in zip(ids, records)
        for j in range(n)
    ]
    comps = [t.completion() for t in runner.run(samples)]
    return [comps[k : k + n] for k in range(0, len(comps), n)]


@dataclass
class PromptStats:
    record: PromptRecord
    repeats: int  # rows of the file holding this prompt (its weight)
    samples: int
    acc_sum: float  # Σ accuracy over the samples
    correct: int  # samples with accuracy > 0


def _score(cfg, record, repeats: int, text: str, comps, lengths: list[int]) -> PromptStats:
    from dapo_async.reward.compose import call_verifier, resolve

    verifier = resolve(cfg.reward.fn)
    accs = []
    for c in comps:
        # any documented form: a bare float, a dict; two or four arguments
        accs.append(call_verifier(verifier, c.text, record.ground_truth, text, record.extra)["acc"])
        lengths.append(len(c.tokens))
    return PromptStats(record, repeats, len(accs), float(sum(accs)), sum(a > 0 for a in accs))


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct: 1 − C(n−c, k) / C(n, k) (Chen et al.
    2021), as a product so large n does not overflow."""
    if n - c < k:
        return 1.0
    return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def _summary(stats: list[PromptStats], k: int) -> dict[str, float]:
    weight = sum(s.repeats for s in stats)
    if not weight:
        return {"eval/accuracy": 0.0, "eval/pass_at_k": 0.0, "eval/k": float(k),
                "eval/num_prompts": 0.0, "eval/num_rows": 0.0}  # fmt: skip
    avg = sum(s.repeats * s.acc_sum / s.samples for s in stats) / weight
    # greedy: one sample stands for all (k = 1): pass@1 is its accuracy
    pass_k = sum(s.repeats * pass_at_k(s.samples, s.correct, min(k, s.samples)) for s in stats)
    return {
        "eval/accuracy": float(avg),
        "eval/pass_at_k": float(pass_k / weight),
        "eval/k": float(k),
        "eval/num_prompts": float(len(stats)),
        "eval/num_rows": float(weight),
    }
