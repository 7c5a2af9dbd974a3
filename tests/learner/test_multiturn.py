"""Environment tokens of multi-turn episodes (``sampled`` = 0) carry no loss, no KL, no
entropy and count in no denominator: the gradient is the one of the same episodes with those
positions out of the loss, whatever their log-probs say, and differs from training them."""

import dataclasses

import numpy as np
import pytest
from learner_helpers import build_trainer, make_config, max_rel_err, synthetic_groups


def _first_gradient(tiny_model, cfg, groups) -> dict:
    """The gradient of the first update of one step (captured before the optimizer)."""
    trainer = build_trainer(tiny_model, cfg, ref=cfg.algo.kl_coef > 0)
    grads = {}
    real_step = trainer._optimizer_step

    def capture():
        if not grads:
            grads.update({n: p.grad.detach().clone() for n, p in trainer.model.named_parameters()
                          if p.grad is not None})  # fmt: skip
        return real_step()

    trainer._optimizer_step = capture
    trainer.step(groups)
    return grads


def _with_sampled(groups, mark):
    """Copies of ``groups`` whose sampled mask is ``mark(response length)`` per response."""
    out = []
    for g in groups:
        sampled = np.concatenate([mark(int(n)) for n in g.response_lens]).astype(np.uint8)
        out.append(dataclasses.replace(g, sampled=sampled, logprobs=g.logprobs.copy(),
                                       versions=g.versions.copy()))  # fmt: skip
    return out


def _middle(n):  # tokens 1 and 2 of a response are the environment's (a tool's answer)
    m = np.ones(n)
    m[1:3] = 0
    return m


def _tail(n):  # the last 2 tokens are the environment's
    m = np.ones(n)
    m[-2:] = 0
    return m


@pytest.mark.parametrize(
    "terms", [["algo.entropy_coef=0.01"], ["algo.objective=ppo_kl", "algo.kl_coef=0.05"]]
)
def test_environment_tokens_change_no_gradient(tiny_model, terms):
    cfg = make_config("learner.num_minibatches=1", "learner.grad_clip=0", *terms)
    groups = synthetic_groups(0, 4)
    masked = _with_sampled(groups, _middle)
    base = _first_gradient(tiny_model, cfg, masked)
    # whatever the environment tokens' behaviour log-probs and versions: the same gradient
    odd = _with_sampled(groups, _middle)
    for g in odd:
        g.logprobs[g.sampled == 0] = -9.0
        g.versions[g.sampled == 0] = 7
    assert max_rel_err(_first_gradient(tiny_model, cfg, odd), base) <= 1e-6
    # trained as if sampled, they would change it (the test can fail)
    assert max_rel_err(_first_gradient(tiny_model, cfg, groups), base) > 1e-3


def test_trailing_environment_tokens_train_like_the_episode_without_them(tiny_model):
    """Environment tokens at the end of every response: the gradient equals the one of the same
    responses cut before them — no loss there and no share of any denominator."""
    for terms in (["algo.loss_agg=token-mean", "algo.entropy_coef=0.01"],
                  ["algo.loss_agg=seq-mean-token-mean"],
                  ["algo.objective=ppo_kl", "algo.kl_coef=0.05"]):  # fmt: skip
        cfg = make_config("learner.num_minibatches=1", "learner.grad_clip=0", *terms)
        groups = synthetic_groups(0, 4)
        cut = []
        for g in groups:
            starts = np.concatenate([[0], np.cumsum(g.response_lens)[:-1]])
            keep = np.concatenate(
                [np.arange(s, s + n - 2) for s, n in zip(starts, g.response_lens)]
            )
            cut.append(dataclasses.replace(
                g, response_lens=g.response_lens - 2, tokens=g.tokens[keep],
                logprobs=g.logprobs[keep], versions=g.versions[keep]))  # fmt: skip
        tail = _first_gradient(tiny_model, cfg, _with_sampled(groups, _tail))
        assert max_rel_err(tail, _first_gradient(tiny_model, cfg, cut)) <= 1e-5, terms
