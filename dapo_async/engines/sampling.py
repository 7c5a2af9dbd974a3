"""Token sampling for engines that decode step by step (the hf streaming decoder): temperature,
top-k and top-p as transformers applies them, and the log-prob of each sampled token under the
distribution ``logprobs_mode`` names (``processed``: what was sampled from; ``raw``: the model's).

Pure tensor math, no model: ``sample(logits_BV, params, generator) -> (token_B, logp_B)``.
"""

from __future__ import annotations

import torch

from dapo_async.engines.base import SamplingParams


def processed_logits(logits_BV: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The logits sampling draws from: divided by the temperature, then everything outside the
    top-k and outside the top-p nucleus set to -inf (greedy: the logits unchanged)."""
    if params.temperature == 0:
        return logits_BV
    out_BV = logits_BV / params.temperature
    if params.top_k > 0 and params.top_k < out_BV.shape[-1]:
        kth_B1 = torch.topk(out_BV, params.top_k, dim=-1).values[:, -1:]
        out_BV = out_BV.masked_fill(out_BV < kth_B1, float("-inf"))
    if params.top_p < 1.0:
        sorted_BV, order_BV = torch.sort(out_BV, descending=True, dim=-1)
        cum_BV = torch.softmax(sorted_BV, -1).cumsum(-1)
        # drop a token when the mass before it already reaches top_p (the first always stays)
        drop_sorted_BV = (cum_BV - torch.softmax(sorted_BV, -1)) >= params.top_p
        drop_BV = torch.zeros_like(drop_sorted_BV).scatter(-1, order_BV, drop_sorted_BV)
        out_BV = out_BV.masked_fill(drop_BV, float("-inf"))
    return out_BV


def sample(
    logits_BV: torch.Tensor, params: SamplingParams, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(sampled token ids [B], their log-probs [B] under ``params.logprobs_mode``)."""
    logits_BV = logits_BV.float()
    proc_BV = processed_logits(logits_BV, params)
    if params.temperature == 0:
        token_B = proc_BV.argmax(-1)
    else:
        token_B = _draw(torch.softmax(proc_BV, -1), generator)
    scored_BV = proc_BV if params.logprobs_mode == "processed" else logits_BV
    logp_B = torch.log_softmax(scored_BV, -1).gather(-1, token_B[:, None]).squeeze(-1)
    return token_B, logp_B


def _draw(probs_BV: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row drawn from ``probs_BV`` by inverting its cumulative sum at a uniform
    draw: B random numbers a step, where ``torch.multinomial`` draws one per vocabulary entry
    (on a CPU, that took as long as a tiny model's attention). ``right=True``: a token of zero
    probability (outside top-k / top-p) is never the first whose cumulative sum exceeds u."""
    cdf_BV = probs_BV.cumsum(-1)
    u_B1 = torch.rand(
        (probs_BV.shape[0], 1), generator=generator, device=probs_BV.device, dtype=cdf_BV.dtype
    )
    token_B1 = torch.searchsorted(cdf_BV, u_B1 * cdf_BV[:, -1:], right=True)
    return token_B1.squeeze(-1).clamp_(max=probs_BV.shape[-1] - 1)
