"""One decode step of a Llama-shaped model (Llama, Qwen2) without transformers' module plumbing:
the same math as ``LlamaForCausalLM.forward`` for one new token per row, in a dozen tensor calls
per layer, with q/k/v and gate/up each fused into one matrix product.

On a CPU the tiny and small models this project decodes spend about as long in Python (module
calls, keyword plumbing, per-call rotary tables) as in kernels; ``HFStream`` runs its decode
steps here when the model qualifies (``LeanDecode.supports``) and keeps transformers' forward for
prefills and for every other architecture.

    token_B, pos_B1, bias_B11T, cache ─► embed ─► per layer: rmsnorm → qkv (one GEMM) → rotary
        → cache.update (the stream's in-place KV buffers) → attention (two batched matrix
        products, grouped-query heads folded in; with a ``SlotKV`` cache, its own write and
        attention) → o_proj → +residual → rmsnorm
        → gate|up (one GEMM) → silu·up → down → +residual ─► norm ─► lm_head ─► logits_BV

The fused matrices are copies: they are rebuilt whenever a source weight changed in place
(``Tensor._version``, which ``load_state_dict`` bumps), so new weights are never missed. The
model's forward pre-hooks run before each step, as they would around ``model(...)``.

With ``kernel`` (``generator.compiled_attention``, on a CPU) the attention of a float32 step
runs in ``cpu_attention.py``'s C kernel (the same math in one pass per row and head), and
through torch's products wherever that kernel does not apply or could not be built.

With ``matmul_dtype`` (``generator.decode_matmul_dtype``: bf16 for a float32 model on a CPU
with native bf16 matmuls) the four weight products of each layer take their inputs and a copy
of the weights in that dtype and return to the model's; norms, rotary, attention, the KV cache
and the logits (``lm_head``) stay in the model's dtype, and a step of fewer than
``LOW_PRECISION_MIN_ROWS`` rows runs wholly in it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dapo_async.engines.cpu_attention import decode_attention
from dapo_async.engines.slot_kv import SlotKV

# Architectures whose decoder layer is exactly: rmsnorm, attention with rotary (q/k/v with
# optional bias), residual, rmsnorm, SwiGLU MLP, residual.
SUPPORTED = ("llama", "qwen2")
# With ``matmul_dtype`` bf16, a step of fewer rows than this multiplies in the model's dtype: on
# a 2-core AMD EPYC (AVX512-BF16) a bf16 product of the tiny policy's shapes costs ~15 µs however
# few its rows (oneDNN), twice fp32's at 4 rows, even at 16-32, and 2.5-3× faster at 64-120.
LOW_PRECISION_MIN_ROWS = 32


def _rms(x, weight, eps):
    dtype = x.dtype
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(dtype)


def _rotate(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class LeanDecode:
    """``__call__(token_B, pos_B1, bias_B11T, cache) -> logits_BV`` for one decode step."""

    @staticmethod
    def supports(model) -> bool:
        c = model.config
        rope = getattr(c, "rope_parameters", None) or {"rope_type": "default"}
        return (
            c.model_type in SUPPORTED
            and rope.get("rope_type", "default") == "default"
            and getattr(c, "hidden_act", "") == "silu"
            and getattr(c, "pretraining_tp", 1) == 1
            and not getattr(c, "use_sliding_window", False)
            and not getattr(c, "mlp_bias", False)
            and hasattr(model, "lm_head")
        )

    def __init__(self, model, matmul_dtype: torch.dtype | None = None, kernel: bool = False):
        c = model.config
        self.model = model
        # attention through engines/cpu_attention.py's C kernel where it applies
        self.kernel = kernel
        # the layers' weight products in this dtype (None: the model's; module docstring)
        self.mm_dtype = None if matmul_dtype in (None, model.dtype) else matmul_dtype
        self.base = model.model
        self.heads, self.kv_heads = c.num_attention_heads, c.num_key_value_heads
        self.head_dim = getattr(c, "head_dim", None) or c.hidden_size // self.heads
        self.scale = self.head_dim**-0.5
        self.eps = c.rms_norm_eps
        theta = c.rope_parameters["rope_theta"]
        dim = self.head_dim
        self.inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
        self._params = list(model.parameters())  # load_state_dict copies into these in place
        self._built_at = None
        self.layers: list[tuple] = []

    def _stamp(self) -> int:
        """Changes whenever any weight changed in place (load_state_dict, an optimizer)."""
        return sum(p._version for p in self._params)

    def _build(self) -> None:
        layers = []
        for layer in self.base.layers:
            a, m = layer.self_attn, layer.mlp
            qkv_w = torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight])
            biases = [a.q_proj.bias, a.k_proj.bias, a.v_proj.bias]
            qkv_b = None if biases[0] is None else torch.cat(biases)
            gu_w = torch.cat([m.gate_proj.weight, m.up_proj.weight])
            o_w, down_w = a.o_proj.weight, m.down_proj.weight
            if self.mm_dtype is not None:  # (model dtype, matmul dtype) pairs
                pairs = ((w, w.to(self.mm_dtype)) for w in (qkv_w, o_w, gu_w, down_w))
                qkv_w, o_w, gu_w, down_w = pairs
            layers.append(
                (
                    layer.input_layernorm.weight,
                    qkv_w,
                    qkv_b,
                    o_w,
                    a.o_proj.bias,
                    layer.post_attention_layernorm.weight,
                    gu_w,
                    down_w,
                )
            )
        self.layers = layers

    def _attend(self, q_BH1D, k_BKTD, v_BKTD, bias_B11T) -> torch.Tensor:
        """Attention of one query per row, as [B, 1, H·D]. The H ÷ KV query heads that share a
        key/value head (grouped-query attention; head h reads KV head h // (H ÷ KV)) are the
        rows of one small matrix product, so nothing is repeated; two batched products and a
        softmax cost less than SDPA's CPU kernel, built for many queries, at one query a row."""
        if self.kernel:  # None where it does not apply: the products below
            out = decode_attention(q_BH1D, k_BKTD, v_BKTD, bias_B11T, self.scale)
            if out is not None:
                return out
        B, KV, D = q_BH1D.shape[0], k_BKTD.shape[1], q_BH1D.shape[-1]
        q_BKRD = q_BH1D.reshape(B, KV, -1, D)
        scores_BKRT = torch.matmul(q_BKRD, k_BKTD.transpose(-1, -2)).mul_(self.scale)
        # the softmax in float32 whatever the model's dtype, as transformers' eager attention
        probs_BKRT = torch.softmax(scores_BKRT.add_(bias_B11T), dim=-1, dtype=torch.float32)
        return torch.matmul(probs_BKRT.to(v_BKTD.dtype), v_BKTD).reshape(B, 1, -1)

    def _linear(self, x, w, b=None):
        """``F.linear``; with ``mm_dtype``, ``w`` is a (model dtype, mm_dtype) pair."""
        if self.mm_dtype is None:
            return F.linear(x, w, b)
        if x.shape[0] < LOW_PRECISION_MIN_ROWS:
            return F.linear(x, w[0], b)
        y = F.linear(x.to(self.mm_dtype), w[1]).to(x.dtype)
        return y if b is None else y + b

    @torch.no_grad()
    def __call__(self, token_B, pos_B1, bias_B11T, cache) -> torch.Tensor:
        for hook in self.model._forward_pre_hooks.values():
            hook(self.model, ())
        stamp = self._stamp()
        if stamp != self._built_at:
            self._build()
            self._built_at = stamp
        B = token_B.shape[0]
        H, KV, D = self.heads, self.kv_heads, self.head_dim
        h = F.embedding(token_B[:, None], self.base.embed_tokens.weight)  # [B, 1, hidden]
        if self.inv_freq.device != h.device:
            self.inv_freq = self.inv_freq.to(h.device)
        freqs = pos_B1[..., None].float() * self.inv_freq  # [B, 1, D/2]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(h.dtype)[:, None], emb.sin().to(h.dtype)[:, None]  # [B,1,1,D]
        mm = self._linear
        for i, (w_in, qkv_w, qkv_b, o_w, o_b, w_post, gu_w, down_w) in enumerate(self.layers):
            x = _rms(h, w_in, self.eps)
            qk, v = mm(x, qkv_w, qkv_b).split([(H + KV) * D, KV * D], dim=-1)
            q, k = _rotate(qk.view(B, 1, H + KV, D).transpose(1, 2), cos, sin).split([H, KV], 1)
            v = v.view(B, 1, KV, D).transpose(1, 2)
            if isinstance(cache, SlotKV):  # each row over its own slot (slot_kv.py)
                cache.write(k, v, i)
                att = cache.attend(q, i, self.scale)
            else:
                att = self._attend(q, *cache.update(k, v, i), bias_B11T)
            h = h + mm(att, o_w, o_b)
            gate, up = mm(_rms(h, w_post, self.eps), gu_w).chunk(2, dim=-1)
            h = h + mm(F.silu(gate) * up, down_w)
        h = _rms(h, self.base.norm.weight, self.eps)
        return F.linear(h[:, -1], self.model.lm_head.weight, self.model.lm_head.bias)
