"""Group-relative advantages (GRPO / DAPO / Dr. GRPO). Pure tensor math, no I/O.

Each response i of a group gets ``Â_i = (R_i − mean(R)) / (std(R) + eps)`` with the unbiased
std; a group of one gets mean 0 and std 1 (so Â = R / (1 + eps)). ``norm_std=False`` is the
Dr. GRPO variant ``Â_i = R_i − mean(R)``. The same value applies to every token of response i.
"""

from __future__ import annotations

import torch


def group_advantages(
    rewards_N: torch.Tensor,
    group_index_N: torch.Tensor,
    norm_std: bool = True,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Advantages of N responses; ``group_index_N[i]`` is the group (0..K-1) of response i."""
    if rewards_N.shape != group_index_N.shape or rewards_N.dim() != 1:
        raise ValueError("rewards_N and group_index_N must be 1-D tensors of the same length")
    if not torch.isfinite(rewards_N).all():
        raise ValueError("rewards must be finite")
    r = rewards_N.to(torch.float64)
    idx = group_index_N.to(torch.long)
    num_groups = int(idx.max()) + 1 if idx.numel() else 0
    count_K = torch.zeros(num_groups, dtype=torch.float64, device=r.device).index_add_(
        0, idx, torch.ones_like(r)
    )
    sum_K = torch.zeros(num_groups, dtype=torch.float64, device=r.device).index_add_(0, idx, r)
    mean_K = sum_K / count_K.clamp(min=1)
    dev_N = r - mean_K[idx]
    sq_K = torch.zeros(num_groups, dtype=torch.float64, device=r.device).index_add_(
        0, idx, dev_N * dev_N
    )
    std_K = torch.sqrt(sq_K / (count_K - 1).clamp(min=1))
    single_K = count_K == 1
    mean_K = torch.where(single_K, torch.zeros_like(mean_K), mean_K)
    std_K = torch.where(single_K, torch.ones_like(std_K), std_K)
    centered_N = r - mean_K[idx]
    adv_N = centered_N / (std_K[idx] + eps) if norm_std else centered_N
    return adv_N.to(rewards_N.dtype)


def group_index_from_sizes(sizes: list[int] | torch.Tensor) -> torch.Tensor:
    """[0,0,0,1,1,...]: the group index of each response, from group sizes."""
    sizes_t = torch.as_tensor(sizes, dtype=torch.long, device="cpu")
    return torch.repeat_interleave(torch.arange(len(sizes_t), device="cpu"), sizes_t)


def broadcast_to_tokens(adv_B: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """Per-response advantages as a [B, T] tensor (zero on padding)."""
    return adv_B[:, None] * mask_BT.to(adv_B.dtype)
