"""The decoupled-clip policy loss (DAPO / GRPO / PPO-KL) and its aggregation modes.

Per response token t with behaviour log-prob b (engine), proximal log-prob p (learner weights
at step start, detached) and current log-prob c (with gradient), advantage A:

    w_t = min(exp(p − b), C)                     (detached; C = is_cap)
    r_t = exp(c − p)
    loss_t = −w_t · min(r_t·A, clip(r_t, 1 − ε_low, 1 + ε_high)·A)
    dual-clip (A < 0): loss_t = w_t · min(−min(...), −c_dual·A)

Bypass mode sets p := b (so w = 1 and r = π/π_behav). Tokens whose raw weight exp(p − b) falls
outside [is_mask_low, is_mask_high], and whole sequences whose geometric-mean weight falls outside
[seq_mask_low, seq_mask_high], contribute zero. Aggregation over the *global* batch:

    token-mean                Σ_t loss_t / N_tokens            (DAPO)
    seq-mean-token-mean       Σ_i (Σ_t loss_it / |y_i|) / N_seqs (original GRPO)
    seq-mean-token-sum        Σ_i Σ_t loss_it / N_seqs
    seq-mean-token-sum-norm   Σ_i Σ_t loss_it / (N_seqs · L)    (Dr. GRPO, L a constant)

N_tokens and N_seqs are passed in by the caller (counted over all micro-batches and all ranks),
so summing the gradients of the parts equals the gradient of the whole batch. Both count only
what is in the loss: a response masked whole (the overlong filter, padding rows) is in neither.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dapo_async.algo.kl import kl_estimate

LOSS_AGG_MODES = (
    "token-mean",
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
)
# exp() of a log-ratio beyond this overflows float32; clamp before exponentiating.
MAX_LOG_RATIO = 20.0


@dataclass(frozen=True)
class PolicyLossConfig:
    clip_low: float = 0.2
    clip_high: float = 0.28
    dual_clip: float = 0.0
    is_cap: float = 2.0
    is_mask_low: float = 0.0
    is_mask_high: float = 0.0
    seq_mask_low: float = 0.0
    seq_mask_high: float = 0.0
    bypass: bool = False
    loss_agg: str = "token-mean"
    norm_len: int = 1
    kl_coef: float = 0.0
    kl_estimator: str = "k3"

    def __post_init__(self) -> None:
        if self.loss_agg not in LOSS_AGG_MODES:
            raise ValueError(f"loss_agg must be one of {LOSS_AGG_MODES}, got {self.loss_agg!r}")


def aggregate(
    loss_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    mode: str,
    global_num_tokens: float | None = None,
    global_num_seqs: float | None = None,
    norm_len: int = 1,
) -> torch.Tensor:
    """Reduce per-token values to a scalar with the global denominators (local if None)."""
    m = mask_BT.to(loss_BT.dtype)
    if mode == "token-mean":
        denom = global_num_tokens if global_num_tokens is not None else m.sum().clamp(min=1)
        return (loss_BT * m).sum() / denom
    # a row with no token in the loss (padding, a filtered response) is no sequence
    n_seqs = global_num_seqs if global_num_seqs is not None else (m.sum(1) > 0).sum().clamp(min=1)
    seq_sum_B = (loss_BT * m).sum(dim=1)
    if mode == "seq-mean-token-mean":
        return (seq_sum_B / m.sum(dim=1).clamp(min=1)).sum() / n_seqs
    if mode == "seq-mean-token-sum":
        return seq_sum_B.sum() / n_seqs
    if mode == "seq-mean-token-sum-norm":
        return seq_sum_B.sum() / (n_seqs * norm_len)
    raise ValueError(f"unknown loss_agg {mode!r}")


def _masked_mean(x_BT: torch.Tensor, m_BT: torch.Tensor) -> torch.Tensor:
    return (x_BT * m_BT).sum() / m_BT.sum().clamp(min=1)


def importance_weights(
    prox_BT: torch.Tensor, behav_BT: torch.Tensor, mask_BT: torch.Tensor, cfg: PolicyLossConfig
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(raw weight exp(p − b), capped weight min(raw, C), keep mask after the token and
    sequence masks) for every token."""
    log_w_BT = (prox_BT - behav_BT).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    w_raw_BT = torch.exp(log_w_BT)
    keep_BT = mask_BT.clone()
    if cfg.is_mask_low > 0:
        keep_BT = keep_BT * (w_raw_BT >= cfg.is_mask_low)
    if cfg.is_mask_high > 0:
        keep_BT = keep_BT * (w_raw_BT <= cfg.is_mask_high)
    if cfg.seq_mask_low > 0 or cfg.seq_mask_high > 0:
        seq_log_w_B = (log_w_BT * mask_BT).sum(1) / mask_BT.sum(1).clamp(min=1)
        seq_w_B = torch.exp(seq_log_w_B)
        seq_keep_B = torch.ones_like(seq_w_B, dtype=torch.bool)
        if cfg.seq_mask_low > 0:
            seq_keep_B &= seq_w_B >= cfg.seq_mask_low
        if cfg.seq_mask_high > 0:
            seq_keep_B &= seq_w_B <= cfg.seq_mask_high
        keep_BT = keep_BT * seq_keep_B[:, None]
    return w_raw_BT, w_raw_BT.clamp(max=cfg.is_cap), keep_BT


def clipped_objective(
    r_BT: torch.Tensor, adv_BT: torch.Tensor, cfg: PolicyLossConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """(per-token clipped surrogate loss, where dual-clip bound it) before importance weights."""
    pg1_BT = -adv_BT * r_BT
    pg2_BT = -adv_BT * r_BT.clamp(1 - cfg.clip_low, 1 + cfg.clip_high)
    loss_BT = torch.maximum(pg1_BT, pg2_BT)
    dual_BT = torch.zeros_like(loss_BT, dtype=torch.bool)
    if cfg.dual_clip > 0:
        cap_BT = -adv_BT * cfg.dual_clip
        dual_BT = (adv_BT < 0) & (loss_BT > cap_BT)
        loss_BT = torch.where(adv_BT < 0, torch.minimum(loss_BT, cap_BT), loss_BT)
    return loss_BT, dual_BT


def policy_loss(
    logp_BT: torch.Tensor,
    prox_logp_BT: torch.Tensor | None,
    behav_logp_BT: torch.Tensor,
    adv_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    cfg: PolicyLossConfig,
    global_num_tokens: float | None = None,
    global_num_seqs: float | None = None,
    ref_logp_BT: torch.Tensor | None = None,
    tap: dict | None = None,
    weights_out: list | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Decoupled clipped policy loss; returns (scalar loss, metrics). A ``tap`` dict receives
    the per-token tensors a reader wants (``clip_marks``): ratio_BT, is_weight_BT (raw),
    clip_BT, keep_BT; ``weights_out`` gets the raw importance weights of the unmasked tokens
    (the learner's ``is_weight`` distribution)."""
    mask_BT = mask_BT.to(logp_BT.dtype)
    behav = behav_logp_BT.detach()
    prox = behav if (cfg.bypass or prox_logp_BT is None) else prox_logp_BT.detach()
    w_raw_BT, w_BT, keep_BT = importance_weights(prox, behav, mask_BT, cfg)
    r_BT = torch.exp((logp_BT - prox).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO))
    loss_BT, dual_BT = clipped_objective(r_BT, adv_BT, cfg)
    loss_BT = loss_BT * w_BT
    kl_BT = None
    if ref_logp_BT is not None:
        kl_BT = kl_estimate(logp_BT, ref_logp_BT.detach(), cfg.kl_estimator)
        if cfg.kl_coef > 0:
            loss_BT = loss_BT + cfg.kl_coef * kl_BT
    # Masked tokens contribute zero but still count in the denominators (the response's length).
    loss_BT = loss_BT * keep_BT
    loss = aggregate(
        loss_BT, mask_BT, cfg.loss_agg, global_num_tokens, global_num_seqs, cfg.norm_len
    )
    with torch.no_grad():
        metrics = _metrics(logp_BT.detach(), prox, r_BT.detach(), adv_BT, mask_BT, cfg)
        metrics |= {
            "dual_clip_frac": _masked_mean(dual_BT.to(r_BT.dtype), mask_BT).item(),
            "is_weight_mean": _masked_mean(w_BT, mask_BT).item(),
            "is_weight_max": (w_raw_BT * mask_BT).max().item() if mask_BT.any() else 0.0,
            "is_masked_frac": 1.0 - (keep_BT.sum() / mask_BT.sum().clamp(min=1)).item(),
        }
        metrics |= weight_quantiles(w_raw_BT, mask_BT)
        if kl_BT is not None:
            metrics["kl_ref"] = _masked_mean(kl_BT.detach(), mask_BT).item()
        if weights_out is not None:
            weights_out.append(w_raw_BT[mask_BT > 0])
        if tap is not None:
            tap |= {
                "ratio_BT": r_BT.detach(),
                "is_weight_BT": w_raw_BT,
                "clip_BT": clip_marks(r_BT.detach(), adv_BT, dual_BT, cfg),
                "keep_BT": keep_BT,
            }
    return loss, metrics


def clip_marks(
    r_BT: torch.Tensor, adv_BT: torch.Tensor, dual_BT: torch.Tensor, cfg: PolicyLossConfig
) -> torch.Tensor:
    """Per token: 0 = its gradient flows, 1 = clipped low (r < 1 − ε_low with A < 0), 2 =
    clipped high (r > 1 + ε_high with A > 0), 3 = bound by the dual clip (the same conditions
    ``pg_clip_frac_low|high`` and ``dual_clip_frac`` count)."""
    low_BT = (r_BT < 1 - cfg.clip_low) & (adv_BT < 0)
    high_BT = (r_BT > 1 + cfg.clip_high) & (adv_BT > 0)
    marks_BT = low_BT.to(torch.int8) + 2 * high_BT.to(torch.int8)
    return torch.where(dual_BT, torch.full_like(marks_BT, 3), marks_BT)


# Quantiles of the raw importance weights reported per step (train/is_weight_p<q>): the body
# and both tails of the distribution the report plots over time.
WEIGHT_QUANTILES = (0.05, 0.5, 0.95)


def weight_quantiles(w_BT: torch.Tensor, mask_BT: torch.Tensor) -> dict[str, float]:
    """``is_weight_p05|p50|p95``: quantiles of the importance weights over the unmasked tokens
    (1.0 each when there are none)."""
    w_N = w_BT[mask_BT > 0].float()
    if w_N.numel() == 0:
        return {f"is_weight_p{round(q * 100):02d}": 1.0 for q in WEIGHT_QUANTILES}
    qs_Q = torch.quantile(w_N, torch.tensor(WEIGHT_QUANTILES, device=w_N.device))
    return {f"is_weight_p{round(q * 100):02d}": v.item() for q, v in zip(WEIGHT_QUANTILES, qs_Q)}


def _metrics(logp_BT, prox_BT, r_BT, adv_BT, mask_BT, cfg: PolicyLossConfig) -> dict[str, float]:
    return {
        "pg_clip_frac_low": _masked_mean(
            ((r_BT < 1 - cfg.clip_low) & (adv_BT < 0)).to(r_BT.dtype), mask_BT
        ).item(),
        "pg_clip_frac_high": _masked_mean(
            ((r_BT > 1 + cfg.clip_high) & (adv_BT > 0)).to(r_BT.dtype), mask_BT
        ).item(),
        "approx_kl_prox": _masked_mean(kl_estimate(logp_BT, prox_BT, "k3"), mask_BT).item(),
        "ratio_mean": _masked_mean(r_BT, mask_BT).item(),
        "num_tokens": mask_BT.sum().item(),
    }
