"""Token sampling of the hf streaming decoder (``engines/sampling.py``): draws follow the
processed distribution, tokens outside top-k / top-p are never drawn, and each token's log-prob
is the one of the distribution ``logprobs_mode`` names."""

import torch

from dapo_async.engines.base import SamplingParams
from dapo_async.engines.sampling import processed_logits, sample

DRAWS = 10_000


def _frequencies(logits_BV, params, seed=0):
    g = torch.Generator().manual_seed(seed)
    counts_BV = torch.zeros_like(logits_BV)
    for _ in range(DRAWS):
        token_B, _ = sample(logits_BV, params, g)
        counts_BV[torch.arange(len(token_B)), token_B] += 1
    return counts_BV / DRAWS


def test_draws_follow_the_processed_distribution():
    logits_BV = torch.tensor([[2.0, 1.0, 0.0, -1.0, 0.5], [0.0, 0.0, 0.0, 0.0, 3.0]])
    params = SamplingParams(temperature=0.7)
    probs_BV = torch.softmax(processed_logits(logits_BV, params), -1)
    freq_BV = _frequencies(logits_BV, params)
    sigma_BV = (probs_BV * (1 - probs_BV) / DRAWS).sqrt()
    assert ((freq_BV - probs_BV).abs() <= 5 * sigma_BV + 1e-9).all(), (freq_BV, probs_BV)


def test_tokens_outside_top_k_and_top_p_are_never_drawn():
    logits_BV = torch.tensor([[3.0, 2.9, 2.8, -5.0, 0.0, 1.0]])
    for params, allowed in [
        (SamplingParams(top_k=2), {0, 1}),
        (SamplingParams(top_p=0.5), {0, 1}),
        (SamplingParams(temperature=0), {0}),
    ]:
        freq_BV = _frequencies(logits_BV, params)
        assert set(freq_BV[0].nonzero().flatten().tolist()) == allowed, params


def test_logprobs_are_the_processed_or_raw_distributions():
    logits_BV = torch.randn(4, 7, generator=torch.Generator().manual_seed(1))
    for mode, scored in [("processed", lambda x: x / 0.5), ("raw", lambda x: x)]:
        params = SamplingParams(temperature=0.5, logprobs_mode=mode)
        token_B, logp_B = sample(logits_BV, params, torch.Generator().manual_seed(2))
        want_B = torch.log_softmax(scored(logits_BV), -1).gather(-1, token_B[:, None])
        torch.testing.assert_close(logp_B, want_B.squeeze(-1))
