import math

import pytest
import torch

from dapo_async.algo.losses import PolicyLossConfig, aggregate, policy_loss

# Two responses, padded to T=3: response 0 has 2 tokens (A=+1), response 1 has 3 (A=-1).
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
ADV = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]]) * MASK
RATIOS = torch.tensor([[1.0, 1.5, 1.0], [0.5, 1.5, 1.0]])
PROX = torch.full((2, 3), math.log(0.6))


def current(ratios=RATIOS, prox=PROX):
    return prox + torch.log(ratios)


def with_garbage_padding(x):
    return torch.where(MASK.bool(), x, torch.full_like(x, 1e6))


def loss_of(cfg, behav=PROX, prox=PROX, **kw):
    return policy_loss(with_garbage_padding(current()), prox, behav, ADV, MASK, cfg, **kw)


# Per-token losses worked out by hand (clip range [0.8, 1.28]):
#   resp 0, A=+1: r=1.0 -> -1.0 ; r=1.5 -> -min(1.5, 1.28) = -1.28
#   resp 1, A=-1: r=0.5 -> -min(-0.5, -0.8) = 0.8 ; r=1.5 -> 1.5 ; r=1.0 -> 1.0
@pytest.mark.parametrize(
    "mode,expected",
    [
        ("token-mean", (-1.0 - 1.28 + 0.8 + 1.5 + 1.0) / 5),
        ("seq-mean-token-mean", ((-1.0 - 1.28) / 2 + (0.8 + 1.5 + 1.0) / 3) / 2),
        ("seq-mean-token-sum", ((-1.0 - 1.28) + (0.8 + 1.5 + 1.0)) / 2),
        ("seq-mean-token-sum-norm", ((-1.0 - 1.28) + (0.8 + 1.5 + 1.0)) / (2 * 4)),
    ],
)
def test_aggregation_modes_hand_computed(mode, expected):
    loss, m = loss_of(PolicyLossConfig(loss_agg=mode, norm_len=4))
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert m["pg_clip_frac_high"] == pytest.approx(1 / 5)
    assert m["pg_clip_frac_low"] == pytest.approx(1 / 5)
    assert m["is_weight_mean"] == pytest.approx(1.0)
    assert m["num_tokens"] == 5


def test_global_denominators_are_used():
    loss, _ = loss_of(PolicyLossConfig(), global_num_tokens=10)
    assert loss.item() == pytest.approx(1.02 / 10, abs=1e-6)
    loss, _ = loss_of(PolicyLossConfig(loss_agg="seq-mean-token-sum"), global_num_seqs=4)
    assert loss.item() == pytest.approx(1.02 / 4, abs=1e-6)


def test_dual_clip_caps_negative_advantage_loss():
    loss, m = loss_of(PolicyLossConfig(dual_clip=1.4))
    # resp 1, r=1.5: loss 1.5 capped at 1.4 * |A| = 1.4
    assert loss.item() == pytest.approx((-1.0 - 1.28 + 0.8 + 1.4 + 1.0) / 5, abs=1e-6)
    assert m["dual_clip_frac"] == pytest.approx(1 / 5)


def test_importance_weight_truncation():
    behav = PROX - math.log(2.0)  # w_raw = exp(prox - behav) = 2
    loss, m = loss_of(PolicyLossConfig(is_cap=1.5), behav=behav)
    assert loss.item() == pytest.approx(1.5 * 1.02 / 5, abs=1e-6)
    assert m["is_weight_mean"] == pytest.approx(1.5)
    assert m["is_weight_max"] == pytest.approx(2.0, rel=1e-5)
    loss, _ = loss_of(PolicyLossConfig(is_cap=3.0), behav=behav)
    assert loss.item() == pytest.approx(2.0 * 1.02 / 5, abs=1e-5)


def test_token_mask_range():
    behav = PROX.clone()
    behav[1, 0] -= math.log(2.0)  # one token with w_raw = 2 (its loss 0.8 -> 1.6 with cap 2)
    loss, m = loss_of(PolicyLossConfig(is_mask_high=1.8), behav=behav)
    assert loss.item() == pytest.approx((-1.0 - 1.28 + 1.5 + 1.0) / 5, abs=1e-6)
    assert m["is_masked_frac"] == pytest.approx(1 / 5)
    loss, _ = loss_of(PolicyLossConfig(is_mask_low=1.5), behav=behav)  # keeps only w >= 1.5
    assert loss.item() == pytest.approx(2 * 0.8 / 5, abs=1e-6)


def test_sequence_geometric_mean_mask():
    behav = PROX.clone()
    behav[0] -= math.log(2.0)  # response 0: geometric-mean weight 2; response 1: 1
    loss, m = loss_of(PolicyLossConfig(seq_mask_high=1.5), behav=behav)
    assert loss.item() == pytest.approx((0.8 + 1.5 + 1.0) / 5, abs=1e-6)
    assert m["is_masked_frac"] == pytest.approx(2 / 5)
    loss, _ = loss_of(PolicyLossConfig(seq_mask_low=1.5, is_cap=2.0), behav=behav)
    assert loss.item() == pytest.approx(2.0 * (-1.0 - 1.28) / 5, abs=1e-6)


def test_bypass_uses_behaviour_as_proximal():
    behav = PROX - math.log(2.0)
    prox_ignored = torch.randn(2, 3)
    cur = with_garbage_padding(behav + torch.log(RATIOS))
    loss, m = policy_loss(cur, prox_ignored, behav, ADV, MASK, PolicyLossConfig(bypass=True))
    assert loss.item() == pytest.approx(1.02 / 5, abs=1e-6)
    assert m["is_weight_mean"] == pytest.approx(1.0)


def test_padding_never_contributes():
    cfg = PolicyLossConfig()
    a, _ = policy_loss(current(), PROX, PROX, ADV, MASK, cfg)
    b, _ = policy_loss(with_garbage_padding(current()), PROX, PROX, ADV, MASK, cfg)
    assert a.item() == pytest.approx(b.item())
    assert torch.isfinite(b)


def test_kl_penalty_term_added():
    ref = PROX - math.log(2.0)
    base, _ = loss_of(PolicyLossConfig())
    with_kl, m = loss_of(PolicyLossConfig(kl_coef=0.5, kl_estimator="k1"), ref_logp_BT=ref)
    # k1 = logp - ref = log(r) + log 2 per token
    k1 = (torch.log(RATIOS) + math.log(2.0)) * MASK
    assert with_kl.item() == pytest.approx(base.item() + 0.5 * k1.sum().item() / 5, abs=1e-6)
    assert m["kl_ref"] == pytest.approx(k1.sum().item() / 5, abs=1e-6)


def test_bad_mode_rejected():
    with pytest.raises(ValueError, match="loss_agg"):
        PolicyLossConfig(loss_agg="mean")
    with pytest.raises(ValueError):
        aggregate(torch.zeros(1, 1), torch.ones(1, 1), "nope")


def test_local_sequence_count_skips_fully_masked_rows():
    """Without global counts, the seq-mean modes divide by the rows that have a token in the
    loss: a padding row (or a filtered response) must not dilute the others."""
    torch.manual_seed(0)
    logp_BT = torch.randn(3, 4) * 0.1 - 2
    mask_BT = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]], dtype=torch.float32)
    adv_BT = torch.tensor([[1.0] * 4, [-1.0] * 4, [1.0] * 4])
    for mode in ("seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"):
        cfg = PolicyLossConfig(loss_agg=mode, norm_len=4)
        with_pad, _ = policy_loss(logp_BT, logp_BT, logp_BT, adv_BT, mask_BT, cfg)
        without, _ = policy_loss(
            logp_BT[:2], logp_BT[:2], logp_BT[:2], adv_BT[:2], mask_BT[:2], cfg
        )
        assert torch.allclose(with_pad, without), mode
