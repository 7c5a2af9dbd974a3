"""DAPO (Yu et al. 2025): the decoupled clipped surrogate with clip-higher (ε_low = algo.clip_low,
ε_high = algo.clip_high) and, by default, the token-level loss (algo.loss_agg = token-mean)."""

from __future__ import annotations

from dapo_async.algo.objectives.policy import PolicyObjective


class DAPO(PolicyObjective):
    name = "dapo"
    asymmetric_clip = True
