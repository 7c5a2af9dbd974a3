"""PPO with a KL penalty to a frozen reference model: the clipped surrogate (clip-higher allowed)
plus algo.kl_coef × KL(π ‖ π_ref) per token (estimator algo.kl_estimator)."""

from __future__ import annotations

from dapo_async.algo.objectives.policy import PolicyObjective


class PPOKL(PolicyObjective):
    name = "ppo_kl"
    asymmetric_clip = True
    kl_penalty = True
