"""The learner's bf16-on-CPU attention: the explicit path computes what torch's sdpa computes
(float64, every mask form transformers hands over), a bf16 learner on the CPU uses it and
matches the sdpa path within bf16 rounding, long sequences, full precision and non-CPU models
keep transformers' sdpa, and a saved checkpoint does not name it."""

import json

import pytest
import torch
from learner_helpers import build_trainer, make_config, synthetic_groups

from dapo_async.learner.attention import (
    EXPLICIT_MAX_KV,
    LOW_PRECISION_CPU_ATTENTION,
    attention_for,
    explicit_attention,
    low_precision_cpu_attention,
)
from dapo_async.learner.batching import groups_to_rows

pytestmark = pytest.mark.timeout(120)


def _qkv(b=3, h=4, g=4, q=7, k=7, d=8, dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (
        torch.randn(b, h, q, d, generator=gen, dtype=dtype),
        torch.randn(b, g, k, d, generator=gen, dtype=dtype),
        torch.randn(b, g, k, d, generator=gen, dtype=dtype),
    )


def _sdpa(q, k, v, mask=None, causal=False):
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, mask, is_causal=causal)


def test_explicit_attention_equals_sdpa_for_every_mask_form():
    q, k, v = _qkv()
    scale = q.shape[-1] ** -0.5
    # right padding: row 1 has 5 real tokens, row 2 has 3 (causal & key is real)
    real_BK = torch.tensor([[1] * 7, [1] * 5 + [0] * 2, [1] * 3 + [0] * 4], dtype=torch.bool)
    keep_B1qk = torch.ones(7, 7, dtype=torch.bool).tril()[None, None] & real_BK[:, None, None, :]
    want = _sdpa(q, k, v, keep_B1qk)
    torch.testing.assert_close(explicit_attention(q, k, v, keep_B1qk, scale), want)
    additive = torch.zeros(keep_B1qk.shape, dtype=torch.float64).masked_fill(~keep_B1qk, -1e30)
    torch.testing.assert_close(explicit_attention(q, k, v, additive, scale), want)
    # no mask, as many queries as keys: causal
    torch.testing.assert_close(
        explicit_attention(q, k, v, None, scale), _sdpa(q, k, v, causal=True)
    )
    # no mask, not causal (an encoder's attention): every key
    got = explicit_attention(q, k, v, None, scale, causal=False)
    torch.testing.assert_close(got, _sdpa(q, k, v))
    # a single query (decoding): every key
    q1 = q[:, :, -1:]
    torch.testing.assert_close(explicit_attention(q1, k, v, None, scale), _sdpa(q1, k, v))
    # grouped-query attention: 2 key/value heads for 4 query heads
    qg, kg, vg = _qkv(g=2, seed=1)
    torch.testing.assert_close(
        explicit_attention(qg, kg, vg, None, scale), _sdpa(qg, kg, vg, causal=True)
    )


def test_explicit_attention_gradients_equal_sdpa():
    q, k, v = (t.requires_grad_() for t in _qkv(g=2))
    grad = torch.randn(q.shape, dtype=torch.float64)
    explicit_attention(q, k, v, None, q.shape[-1] ** -0.5).backward(grad)
    mine = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    _sdpa(q, k, v, causal=True).backward(grad)
    for a, t in zip(mine, (q, k, v), strict=True):
        torch.testing.assert_close(a, t.grad)


class _Attn(torch.nn.Module):  # what transformers passes as `module`
    training = False


def test_long_sequences_and_full_precision_keep_transformers_sdpa():
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    for n, dtype, autocast in (
        (EXPLICIT_MAX_KV + 1, torch.float32, True),
        (8, torch.float32, False),
    ):
        q, k, v = _qkv(b=1, q=n, k=n, dtype=dtype)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            got, _ = low_precision_cpu_attention(_Attn(), q, k, v, None, is_causal=True)
            want, _ = sdpa_attention_forward(_Attn(), q, k, v, None, is_causal=True)
        assert torch.equal(got, want)


def test_bf16_learner_on_cpu_uses_it_and_matches_sdpa(tiny_model, tmp_path):
    """The tiny model's log-probs and gradients under bf16 autocast, explicit path vs
    transformers' sdpa: equal within bf16 rounding; the saved config does not name it."""
    results = []
    for attn in ("sdpa", LOW_PRECISION_CPU_ATTENTION):
        trainer = build_trainer(tiny_model, make_config("learner.compute_dtype=bfloat16"))
        assert trainer.model.config._attn_implementation == LOW_PRECISION_CPU_ATTENTION
        trainer.model.config._attn_implementation = attn
        rows = synthetic_groups(0, 4)
        mb = trainer._plan(groups_to_rows(rows))[0][0]
        logp_BT, _ = trainer._forward_logp(trainer.train_model, mb)
        (logp_BT * mb.mask_BT).sum().backward()
        grads = torch.cat([p.grad.flatten() for p in trainer.model.parameters()])
        results.append((logp_BT.detach(), mb.mask_BT, grads))
    (lp_a, mask, g_a), (lp_b, _, g_b) = results
    assert (lp_a - lp_b).abs()[mask > 0].max() < 0.05
    assert torch.nn.functional.cosine_similarity(g_a, g_b, dim=0) > 0.99
    trainer.model.save_pretrained(tmp_path / "ckpt")
    assert LOW_PRECISION_CPU_ATTENTION not in json.dumps(
        json.loads((tmp_path / "ckpt" / "config.json").read_text())
    )
    assert torch.isfinite(torch.tensor(trainer.step(synthetic_groups(1, 4))["train/loss"]))


def test_models_off_the_cpu_or_in_full_precision_are_left_alone(tiny_model):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    assert attention_for(model, torch.float32) == "sdpa"
    with torch.device("meta"):
        meta = AutoModelForCausalLM.from_config(model.config)
    assert attention_for(meta, torch.bfloat16) == "sdpa"
    assert attention_for(torch.nn.Linear(2, 2), torch.bfloat16) is None
    assert attention_for(model, torch.bfloat16) == LOW_PRECISION_CPU_ATTENTION
