"""Token entropy of the policy from logits: H = logsumexp(z) − Σ softmax(z)·z."""

from __future__ import annotations

import torch


def entropy_from_logits(logits_BTV: torch.Tensor) -> torch.Tensor:
    logits = logits_BTV.float()
    lse_BT = torch.logsumexp(logits, dim=-1)
    probs = torch.softmax(logits, dim=-1)
    return lse_BT - (probs * logits).sum(-1)


def token_logprobs(
    logits_BTV: torch.Tensor, tokens_BT: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """log π(token) under ``logits / temperature`` (what an engine samples with)."""
    logits = logits_BTV.float() / temperature
    return torch.log_softmax(logits, dim=-1).gather(-1, tokens_BT.long().unsqueeze(-1)).squeeze(-1)
