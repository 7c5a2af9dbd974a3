"""KL estimators between the policy and a reference, per token (Schulman's k1, k2, k3).

With samples from π and ``log_ratio = log π_ref − log π``:
k1 = −log_ratio (unbiased, high variance), k2 = ½·log_ratio² (biased, low variance),
k3 = exp(log_ratio) − 1 − log_ratio (unbiased, non-negative, low variance).
Used as a PPO-style penalty term (``algo.kl_coef`` > 0) and as a metric.
"""

from __future__ import annotations

import torch

KL_ESTIMATORS = ("k1", "k2", "k3")
# Clamp the log-ratio so exp() stays finite in float32.
MAX_LOG_RATIO = 20.0


def kl_estimate(logp_BT: torch.Tensor, ref_logp_BT: torch.Tensor, kind: str = "k3") -> torch.Tensor:
    log_ratio = (ref_logp_BT - logp_BT).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    if kind == "k1":
        return -log_ratio
    if kind == "k2":
        return 0.5 * log_ratio * log_ratio
    if kind == "k3":
        return torch.exp(log_ratio) - 1 - log_ratio
    raise ValueError(f"kl estimator must be one of {KL_ESTIMATORS}, got {kind!r}")
