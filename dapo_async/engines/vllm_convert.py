"""Conversions between our engine types (``engines/base.py``) and vLLM's, shared by the vLLM
engine (``vllm.py``) and its streaming decoder (``vllm_stream.py``); vLLM is imported lazily."""

from __future__ import annotations

import numpy as np

from dapo_async.engines.base import Completion, SamplingParams


def vllm_params(params: SamplingParams):
    """vLLM's SamplingParams for ours (sampled-token log-probs on)."""
    from vllm import SamplingParams as VSP

    greedy = params.temperature == 0
    return VSP(
        n=params.n,
        temperature=0.0 if greedy else params.temperature,
        top_p=params.top_p,
        top_k=params.top_k if params.top_k > 0 else -1,
        max_tokens=params.max_tokens,
        stop=list(params.stop) or None,
        stop_token_ids=list(params.stop_token_ids) or None,
        logprobs=0,
        seed=params.seed,
    )


def completion(c, versions: list[int] | None = None) -> Completion:
    """Our Completion from one vLLM CompletionOutput."""
    toks = np.asarray(c.token_ids, np.int32)
    lps = np.asarray(
        [entry[int(t)].logprob for t, entry in zip(c.token_ids, c.logprobs or [])], np.float32
    )
    if lps.shape != toks.shape:
        raise RuntimeError(f"vLLM returned {lps.shape[0]} log-probs for {toks.shape[0]} tokens")
    return Completion(
        tokens=toks,
        logprobs=lps,
        finish="length" if c.finish_reason == "length" else "stop",
        text=c.text,
        versions=None if versions is None else np.asarray(versions, np.int32),
    )
