"""The lean decode step (``engines/hf_decode.py``) computes what transformers' forward computes,
for Llama and Qwen2 (q/k/v bias, grouped-query attention), with left padding, across weight
updates; and ``HFStream`` samples the same tokens with it as without it."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

from dapo_async.engines.hf_decode import LeanDecode
from dapo_async.engines.hf_stream import HFStream
from dapo_async.engines.padded_kv import grow_in_place

SHAPE = dict(
    vocab_size=96,
    hidden_size=64,
    intermediate_size=160,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
)


def model_of(kind: str):
    torch.manual_seed(0)
    cfg = LlamaConfig(**SHAPE) if kind == "llama" else Qwen2Config(**SHAPE)
    m = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    if kind == "qwen2":  # non-zero q/k/v biases, so a dropped bias would show
        for layer in m.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                torch.nn.init.normal_(proj.bias, std=0.5)
    return m


def prefill(model, rows):
    width = max(len(r) for r in rows)
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, width - len(r) :] = torch.tensor(r)
        mask[i, width - len(r) :] = 1
    out = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0))
    grow_in_place(out.past_key_values)
    return out.past_key_values, mask, out.logits[:, -1]


def bias_of(mask):
    bias = torch.zeros(mask.shape, dtype=torch.float32)
    return bias.masked_fill_(mask == 0, torch.finfo(torch.float32).min)[:, None, None, :]


@pytest.mark.parametrize("kernel", [False, True], ids=["torch-attention", "c-attention"])
@pytest.mark.parametrize("kind", ["llama", "qwen2"])
@torch.no_grad()
def test_lean_steps_equal_transformers_forward(kind, kernel):
    model = model_of(kind)
    assert LeanDecode.supports(model)
    lean = LeanDecode(model, kernel=kernel)
    rows = [[5, 6, 7, 8, 9], [11, 12], [20, 21, 22]]  # left-padded to 5
    ref_cache, ref_mask, _ = prefill(model, rows)
    lean_cache, lean_mask, logits = prefill(model, rows)
    for step in range(6):
        if step == 3:  # new weights in place, as update_weights loads them
            sd = {k: v + 0.01 * torch.randn_like(v) for k, v in model.state_dict().items()}
            model.load_state_dict(sd)
        token_B = logits.argmax(-1)
        ref_mask = torch.cat([ref_mask, torch.ones((3, 1), dtype=torch.long)], 1)
        lean_mask = torch.cat([lean_mask, torch.ones((3, 1), dtype=torch.long)], 1)
        pos_B1 = ref_mask.sum(-1, keepdim=True) - 1
        ref = model(
            input_ids=token_B[:, None],
            attention_mask=bias_of(ref_mask),
            position_ids=pos_B1,
            past_key_values=ref_cache,
            use_cache=True,
        ).logits[:, -1]
        logits = lean(token_B, pos_B1, bias_of(lean_mask), lean_cache)
        assert (logits - ref).abs().max() < 1e-5, (kind, step)
    if kernel:  # the C kernel did the attention (cpu_attention.py), not the fallback
        from dapo_async.engines.cpu_attention import kernel as c_kernel

        assert c_kernel() is not None


def test_other_architectures_keep_transformers_forward():
    from transformers import GPT2Config

    gpt2 = AutoModelForCausalLM.from_config(GPT2Config(n_layer=1, n_embd=32, n_head=2))
    assert not LeanDecode.supports(gpt2)
    scaled = model_of("llama")
    scaled.config.rope_parameters = {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}
    assert not LeanDecode.supports(scaled)


class Engine:
    """The part of HFEngine the stream reads."""

    def __init__(self, model, kernel=False):
        self.model, self.device, self.version = model, torch.device("cpu"), 0
        self.pad_id, self.eos_id = 0, 1
        self.decode_matmul_dtype = None
        self.decode_attention_kernel = kernel

        class Tok:
            def decode(self, ids, skip_special_tokens=True):
                return " ".join(map(str, ids))

        self.tokenizer = Tok()


def test_the_stream_samples_the_same_tokens_with_the_lean_step():
    from dapo_async.engines.base import SamplingParams

    params = SamplingParams(n=2, temperature=1.0, top_p=1.0, top_k=-1, max_tokens=12)
    outs = []
    for lean, kernel in ((False, False), (True, False), (True, True)):
        s = HFStream(Engine(model_of("llama"), kernel), chunk_tokens=4, seed=3, lean=lean)
        assert (s.lean is not None) == lean
        s.add_request("a", [5, 6, 7], params)
        s.add_request("b", [9, 10], params)
        done = []
        while s.num_inflight:
            done += s.step()
        outs.append({rid: [(c.tokens.tolist(), c.logprobs) for c in cs] for rid, cs in done})
    plain = outs[0]
    for lean in outs[1:]:  # the lean step, with torch's attention and with the C kernel
        for rid in plain:
            for (tok_a, lp_a), (tok_b, lp_b) in zip(plain[rid], lean[rid]):
                assert tok_a == tok_b
                assert abs(lp_a - lp_b).max() < 1e-5


@torch.no_grad()
def test_bf16_products_keep_the_logits_close_and_small_steps_exact():
    """``matmul_dtype=bf16`` (generator.decode_matmul_dtype): a step of at least
    LOW_PRECISION_MIN_ROWS rows multiplies the layers' weights in bf16 (logits within bf16's
    rounding of float32's, not equal); a step of fewer rows is float32's exactly."""
    from dapo_async.engines.hf_decode import LOW_PRECISION_MIN_ROWS

    model = model_of("qwen2")
    exact, mixed = LeanDecode(model), LeanDecode(model, torch.bfloat16)
    assert LeanDecode(model, torch.float32).mm_dtype is None  # the model's own dtype
    g = torch.Generator().manual_seed(0)
    for rows in (LOW_PRECISION_MIN_ROWS - 1, LOW_PRECISION_MIN_ROWS + 8):
        prompts = [torch.randint(2, 90, (int(n),), generator=g).tolist() for n in range(rows)]
        prompts = [p or [3] for p in prompts]
        cache_a, mask, logits = prefill(model, prompts)
        cache_b, _, _ = prefill(model, prompts)
        token_B = logits.argmax(-1)
        mask = torch.cat([mask, torch.ones((rows, 1), dtype=torch.long)], 1)
        pos_B1 = mask.sum(-1, keepdim=True) - 1
        ref = exact(token_B, pos_B1, bias_of(mask), cache_a)
        got = mixed(token_B, pos_B1, bias_of(mask), cache_b)
        diff = (got - ref).abs().max().item()
        if rows < LOW_PRECISION_MIN_ROWS:
            assert diff == 0.0
        else:
            assert 0.0 < diff < 0.05 * ref.abs().max().item(), diff
