"""The learner's attention when it computes in bf16 (or fp16) on a CPU.

torch's CPU flash-attention kernel is slow in bf16 at short sequences, its backward above all.
A one-off forward + backward timing (not a repo command; bf16 autocast, 4 heads of 32, ~3,200
tokens a call, 2-core AMD EPYC with AVX512-BF16, torch 2.13): at 50 positions the kernel took
30 ms, two plain bf16 matmuls around an fp32 softmax (``explicit_attention``) 6 ms; at 128, 27
vs 14; at 256, 24 vs 26; at 1,024, 59 vs 188. In the main job's learner the kernel's backward
was the largest single cost of a step; with the explicit path `bash tools/train.sh`'s learner
spends 0.21 s a step in forward and backward against 0.37 s (docs/results.md).

``attention_for`` registers ``LOW_PRECISION_CPU_ATTENTION`` with transformers and points a
model's config at it:

    keys ≤ EXPLICIT_MAX_KV:  scores = q·kᵀ (compute dtype) → mask → softmax in fp32 → · v
    otherwise, on a GPU, or in full precision: transformers' own sdpa path, unchanged

The masks are transformers' sdpa masks (boolean, True = attend; None where plain causal).
The implementation name lives only in the in-memory config (``_attn_implementation`` is not
written by ``save_pretrained``), so checkpoints and weight sync are untouched.
"""

from __future__ import annotations

import torch

from dapo_async.devices import active_compute_dtype

LOW_PRECISION_CPU_ATTENTION = "dapo_cpu_low_precision"
# Longest key sequence that goes through the explicit matmuls: up to 128 they beat the
# kernel 2–5× (module docstring), at 256 they tie, beyond it the kernel's tiling wins and the
# explicit path's [B, H, L, L] scores grow with L².
EXPLICIT_MAX_KV = 192
LOW_PRECISION = (torch.bfloat16, torch.float16)


def _sdpa():
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward


def low_precision_cpu_attention(
    module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kw
):
    """transformers' attention-function signature: ``query [B, H, Lq, D]``, ``key``/``value``
    ``[B, Hkv, Lk, D]``; returns ``([B, Lq, H, D], None)``."""
    q_len, kv_len = query.shape[2], key.shape[2]
    explicit = (
        query.device.type == "cpu"
        # autocast's dtype where it is on: rotary embeddings hand over fp32 queries even then
        and active_compute_dtype(query.device.type, query.dtype) in LOW_PRECISION
        and kv_len <= EXPLICIT_MAX_KV
        and (attention_mask is not None or q_len in (1, kv_len))
        and kw.get("position_bias") is None
    )
    if not explicit:
        return _sdpa()(module, query, key, value, attention_mask, dropout, scaling, is_causal, **kw)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    p = dropout if module.training else 0.0
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    out_BHqD = explicit_attention(query, key, value, attention_mask, scale, p, causal)
    return out_BHqD.transpose(1, 2).contiguous(), None


def explicit_attention(
    query_BHqD, key_BGkD, value_BGkD, mask, scale: float, dropout=0.0, causal=True
):
    """softmax(q·kᵀ·scale + mask)·v with the softmax in fp32 (or the inputs' dtype if wider)
    and the products in the inputs' (or autocast's) dtype. ``mask``: boolean ``[B, 1, Lq, ≥Lk]``
    (True = attend), additive float, or None: causal (``causal``, Lq == Lk) or every key (one
    query, or not causal). G key/value heads each serve H ÷ G query heads."""
    q_len, kv_len = query_BHqD.shape[2], key_BGkD.shape[2]
    groups = query_BHqD.shape[1] // key_BGkD.shape[1]
    if groups > 1:
        key_BGkD = key_BGkD.repeat_interleave(groups, dim=1)
        value_BGkD = value_BGkD.repeat_interleave(groups, dim=1)
    scores_BHqk = torch.matmul(query_BHqD, key_BGkD.transpose(2, 3))
    scores_BHqk = scores_BHqk.to(torch.promote_types(scores_BHqk.dtype, torch.float32)) * scale
    lowest = torch.finfo(scores_BHqk.dtype).min  # not −inf: a row with no key left stays finite
    if mask is not None:
        mask = mask[..., :kv_len]
        if mask.dtype == torch.bool:
            scores_BHqk = scores_BHqk.masked_fill(~mask, lowest)
        else:
            scores_BHqk = scores_BHqk + mask.to(scores_BHqk.dtype)
    elif causal and q_len > 1:
        causal_qk = torch.ones(q_len, kv_len, dtype=torch.bool, device=scores_BHqk.device).tril()
        scores_BHqk = scores_BHqk.masked_fill(~causal_qk, lowest)
    probs_BHqk = torch.softmax(scores_BHqk, dim=-1)
    if dropout > 0.0:
        probs_BHqk = torch.nn.functional.dropout(probs_BHqk, p=dropout)
    if not torch.is_autocast_enabled(probs_BHqk.device.type):
        probs_BHqk = probs_BHqk.to(value_BGkD.dtype)
    return torch.matmul(probs_BHqk, value_BGkD)


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(LOW_PRECISION_CPU_ATTENTION, low_precision_cpu_attention)
    AttentionMaskInterface.register(LOW_PRECISION_CPU_ATTENTION, sdpa_mask)


def attention_for(model: torch.nn.Module, compute_dtype: torch.dtype | None) -> str | None:
    """Point ``model`` (a transformers model) at the low-precision CPU attention when it runs on
    a CPU, computes in bf16/fp16 and uses transformers' sdpa; returns the implementation now in
    use (None: a model without a transformers config, left alone)."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "_attn_implementation"):
        return None
    device = next(model.parameters()).device
    if (
        device.type == "cpu"
        and compute_dtype in LOW_PRECISION
        and config._attn_implementation == "sdpa"
    ):
        _register()
        config._attn_implementation = LOW_PRECISION_CPU_ATTENTION
    return config._attn_implementation
