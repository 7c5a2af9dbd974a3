import math

import numpy as np
import pytest
import torch

from dapo_async.algo.advantages import broadcast_to_tokens, group_advantages, group_index_from_sizes
from dapo_async.algo.dpo import dpo_loss, dpo_pairs
from dapo_async.algo.entropy import entropy_from_logits, token_logprobs
from dapo_async.algo.filters import dynamic_sampling_keep, overlong_filter_mask
from dapo_async.algo.kl import kl_estimate
from dapo_async.algo.overlong import overlong_penalty


def test_group_advantages_hand_computed():
    rewards = torch.tensor([1.0, -1.0, -1.0, 1.0, 1.0, 2.0, 2.0])
    idx = group_index_from_sizes([4, 1, 2])
    adv = group_advantages(rewards, idx)
    s = 1 / math.sqrt(4 / 3)  # unbiased std of [1,-1,-1,1] is sqrt(4/3)
    expected = [s, -s, -s, s, 1.0, 0.0, 0.0]  # singleton: mean 0, std 1; constant group: 0
    assert adv.tolist() == pytest.approx(expected, abs=1e-5)
    dr = group_advantages(rewards, idx, norm_std=False)
    assert dr.tolist() == pytest.approx([1, -1, -1, 1, 1, 0, 0], abs=1e-6)


def test_group_advantages_validation_and_broadcast():
    with pytest.raises(ValueError, match="finite"):
        group_advantages(torch.tensor([1.0, float("nan")]), torch.tensor([0, 0]))
    with pytest.raises(ValueError):
        group_advantages(torch.tensor([1.0]), torch.tensor([0, 0]))
    adv = broadcast_to_tokens(torch.tensor([2.0, -1.0]), torch.tensor([[1, 1, 0], [1, 0, 0]]))
    assert adv.tolist() == [[2, 2, 0], [-1, 0, 0]]


def test_kl_estimators_hand_computed():
    logp = torch.tensor([math.log(0.5)])
    ref = torch.tensor([math.log(0.25)])
    assert kl_estimate(logp, ref, "k1").item() == pytest.approx(math.log(2), abs=1e-6)
    assert kl_estimate(logp, ref, "k2").item() == pytest.approx(0.5 * math.log(2) ** 2, abs=1e-6)
    assert kl_estimate(logp, ref, "k3").item() == pytest.approx(0.5 - 1 + math.log(2), abs=1e-6)
    with pytest.raises(ValueError):
        kl_estimate(logp, ref, "k4")


def test_dpo_pairs_and_loss_hand_computed():
    rewards = torch.tensor([1.0, -1.0, 0.5, 1.0, 1.0, -1.0, 2.0])
    idx = group_index_from_sizes([3, 2, 2])
    chosen, rejected = dpo_pairs(rewards, idx)
    assert chosen.tolist() == [0, 6] and rejected.tolist() == [1, 5]  # group 1 has no pair
    loss, m = dpo_loss(
        torch.tensor([-1.0]), torch.tensor([-3.0]), torch.tensor([-2.0]), torch.tensor([-2.5]), 0.1
    )
    assert loss.item() == pytest.approx(math.log1p(math.exp(-0.15)), abs=1e-6)
    assert m["dpo_pref_acc"] == 1.0 and m["dpo_margin_mean"] == pytest.approx(0.15)


def test_dynamic_sampling_predicate():
    acc = np.array([1, 1, 1, 0, 1, 0, 0, 0], dtype=np.float32)
    keep = dynamic_sampling_keep(acc, np.array([3, 3, 2]))
    assert keep.tolist() == [False, True, False]
    band = dynamic_sampling_keep(acc, np.array([3, 3, 2]), acc_R=acc, min_acc=0.5)
    assert band.tolist() == [False, False, False]
    score = np.array([1.0, 1.0, 0.9, -1, -1, -1], dtype=np.float32)  # score metric: 0.9 differs
    assert dynamic_sampling_keep(score, np.array([3, 3])).tolist() == [True, False]
    assert dynamic_sampling_keep(np.zeros(0), np.zeros(0, dtype=int)).tolist() == []
    with pytest.raises(ValueError):
        dynamic_sampling_keep(acc, np.array([3, 3]))


def test_overlong_penalty_and_filter():
    assert overlong_penalty(16, 20, 4) == 0.0
    assert overlong_penalty(18, 20, 4) == pytest.approx(-0.5)
    assert overlong_penalty(20, 20, 4) == pytest.approx(-1.0)
    assert overlong_penalty(25, 20, 4) == -1.0
    # paper values: L_max 20480, L_cache 4096
    assert overlong_penalty(16384, 20480, 4096) == 0.0
    assert overlong_penalty(18432, 20480, 4096) == pytest.approx(-0.5)
    with pytest.raises(ValueError):
        overlong_penalty(1, 4, 4)
    assert overlong_filter_mask(np.array([True, False])).tolist() == [0.0, 1.0]


def test_entropy_and_token_logprobs():
    logits = torch.zeros(1, 2, 4)
    assert entropy_from_logits(logits)[0].tolist() == pytest.approx([math.log(4)] * 2)
    peaked = torch.tensor([[[100.0, 0, 0, 0]]])
    assert entropy_from_logits(peaked).item() == pytest.approx(0.0, abs=1e-4)
    lp = token_logprobs(torch.log(torch.tensor([[[0.1, 0.2, 0.7]]])), torch.tensor([[2]]))
    assert lp.item() == pytest.approx(math.log(0.7), abs=1e-6)
    lp_t = token_logprobs(
        torch.log(torch.tensor([[[0.25, 0.75]]])), torch.tensor([[1]]), temperature=0.5
    )
    assert lp_t.item() == pytest.approx(math.log(0.75**2 / (0.25**2 + 0.75**2)), abs=1e-6)
