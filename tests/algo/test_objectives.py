"""The objectives behind one base (algo/objectives/): what each asks of the learner. Their
losses are checked through the trainer against hand-computed values (tests/learner)."""

import numpy as np
import pytest

from dapo_async.algo.objectives import make_objective
from dapo_async.config import load_config


def _obj(*overrides):
    cfg = load_config(None, list(overrides))
    return make_objective(cfg.algo, cfg.generator.max_tokens)


def test_each_objective_says_what_it_needs():
    dapo, grpo = _obj("algo.objective=dapo"), _obj("algo.objective=grpo")
    assert (dapo.loss_cfg.clip_low, dapo.loss_cfg.clip_high) == (0.2, 0.28)
    assert grpo.loss_cfg.clip_high == grpo.loss_cfg.clip_low  # symmetric
    assert dapo.needs_proximal and not dapo.needs_reference and dapo.packable
    assert _obj("algo.bypass=true").needs_proximal is False
    kl = _obj("algo.objective=ppo_kl", "algo.kl_coef=0.05")
    assert kl.needs_reference and kl.loss_cfg.kl_coef == 0.05
    assert not _obj("algo.objective=ppo_kl").needs_reference  # kl_coef 0: no reference
    assert _obj("algo.track_kl_ref=true").needs_reference  # the KL metric needs one
    dpo = _obj("algo.objective=dpo")
    assert (dpo.unit, dpo.packable, dpo.needs_proximal) == (2, False, False)
    assert _obj("algo.objective=dpo", "algo.dpo_reference=model").needs_reference
    assert dapo.loss_cfg.norm_len == 24  # 0 = generator.max_tokens


def test_units_are_responses_or_the_best_and_worst_of_each_group():
    rewards = np.array([0.0, 1.0, -1.0, 0.5, 2.0, -2.0], np.float32)
    group = np.array([0, 0, 0, 1, 1, 1])
    assert _obj().units(rewards, group).tolist() == [[0], [1], [2], [3], [4], [5]]
    assert _obj("algo.objective=dpo").units(rewards, group).tolist() == [[1, 2], [4, 5]]


def test_an_unknown_objective_names_the_choices():
    cfg = load_config(None, [])
    cfg.algo.objective = "reinforce"
    with pytest.raises(ValueError, match=r"algo\.objective must be one of"):
        make_objective(cfg.algo, 24)
