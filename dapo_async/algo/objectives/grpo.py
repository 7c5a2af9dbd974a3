"""GRPO's surrogate: the same decoupled clipped loss with symmetric clipping (ε = algo.clip_low
on both sides); the original GRPO aggregates with algo.loss_agg = seq-mean-token-mean."""

from __future__ import annotations

from dapo_async.algo.objectives.policy import PolicyObjective


class GRPO(PolicyObjective):
    name = "grpo"
    asymmetric_clip = False
