"""Online DPO on group pairs: the highest- and lowest-reward responses of each group.

    loss = −log σ(β · ((log π(y_w) − log π_ref(y_w)) − (log π(y_l) − log π_ref(y_l))))

with sequence log-probs (sums over response tokens). Groups whose rewards are all equal give no
pair. The reference log-probs are the behaviour log-probs (on-policy online DPO) or a frozen
reference model's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def dpo_pairs(
    rewards_N: torch.Tensor, group_index_N: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices (chosen, rejected) of one pair per group with distinct rewards (first max/min)."""
    chosen, rejected = [], []
    for g in torch.unique(group_index_N, sorted=True).tolist():
        idx = torch.nonzero(group_index_N == g).flatten()
        r = rewards_N[idx]
        if r.max() > r.min():
            chosen.append(int(idx[int(torch.argmax(r))]))
            rejected.append(int(idx[int(torch.argmin(r))]))
    dev = rewards_N.device
    return (
        torch.tensor(chosen, dtype=torch.long, device=dev),
        torch.tensor(rejected, dtype=torch.long, device=dev),
    )


def dpo_loss(
    seq_logp_chosen_P: torch.Tensor,
    seq_logp_rejected_P: torch.Tensor,
    ref_chosen_P: torch.Tensor,
    ref_rejected_P: torch.Tensor,
    beta: float,
    global_num_pairs: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Mean DPO loss over pairs (divided by ``global_num_pairs`` when given)."""
    margin_P = beta * (
        (seq_logp_chosen_P - ref_chosen_P.detach())
        - (seq_logp_rejected_P - ref_rejected_P.detach())
    )
    losses_P = -F.logsigmoid(margin_P)
    denom = global_num_pairs if global_num_pairs is not None else max(losses_P.numel(), 1)
    loss = losses_P.sum() / denom
    with torch.no_grad():
        metrics = {
            "dpo_margin_mean": margin_P.mean().item() if margin_P.numel() else 0.0,
            "dpo_pref_acc": (margin_P > 0).float().mean().item() if margin_P.numel() else 0.0,
            "dpo_num_pairs": float(margin_P.numel()),
        }
    return loss, metrics
