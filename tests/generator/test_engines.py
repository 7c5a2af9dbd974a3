"""Engines against a transformers forward pass: per-token log-probs of sampled responses agree
(fp32, max |Δ| ≤ 1e-4), greedy outputs agree, and vLLM applies new weights (and the old ones
again) exactly. The vLLM CPU engine runs in its own process (vllm_probe.py)."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from testutil import greedy_tokens, run_vllm_script

from dapo_async.engines.base import SamplingParams
from dapo_async.engines.hf import HFEngine

HERE = Path(__file__).resolve().parent
LOGPROB_TOL = 1e-4


def chat_prompts(tok, n=6):
    from dapo_async.data.tasks import generate

    return [
        tok.apply_chat_template(
            r.messages, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        for r in generate("chain", "eval", n, 3, 0)
    ]


def forward_logprobs(model, prompt, tokens, temperature=1.0):
    """log π(token_t | prompt, tokens_<t) from one transformers forward pass."""
    ids = torch.tensor([list(prompt) + list(tokens)])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float() / temperature
    pos = torch.arange(len(prompt) - 1, len(prompt) - 1 + len(tokens))
    return (
        torch.log_softmax(logits[pos], -1).gather(-1, torch.tensor(tokens)[:, None])[:, 0].numpy()
    )


def max_delta(model, prompts, comps, temperature):
    worst = 0.0
    for prompt, per_prompt in zip(prompts, comps):
        for c in per_prompt:
            toks = c["tokens"] if isinstance(c, dict) else c.tokens.tolist()
            lps = np.asarray(c["logprobs"] if isinstance(c, dict) else c.logprobs)
            ref = forward_logprobs(model, prompt, toks, temperature)
            worst = max(worst, float(np.abs(ref - lps).max()))
    return worst


@pytest.mark.parametrize("temperature", [1.0, 0.8])
def test_hf_engine_logprobs_match_forward(tiny_model, temperature):
    eng = HFEngine(str(tiny_model))
    prompts = chat_prompts(eng.tokenizer)
    comps = eng.generate(
        prompts, SamplingParams(n=2, temperature=temperature, max_tokens=30, seed=0)
    )
    assert max_delta(eng.model, prompts, comps, temperature) <= LOGPROB_TOL
    greedy = eng.generate(prompts, SamplingParams(n=1, temperature=0.0, max_tokens=30))
    for prompt, per_prompt in zip(prompts, greedy):
        assert per_prompt[0].tokens.tolist() == greedy_tokens(eng.model, prompt, eng.eos_id)


@pytest.mark.slow
def test_vllm_cpu_engine_logprobs_greedy_and_weight_updates(tiny_model, tmp_path, cli_env):
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model)).eval()
    new = AutoModelForCausalLM.from_pretrained(str(tiny_model)).eval()
    torch.manual_seed(0)
    with torch.no_grad():
        for p in new.parameters():  # tied embeddings appear once
            p.add_(0.05 * torch.randn_like(p))
    new_file = tmp_path / "new.safetensors"
    save_file({k: v.clone().contiguous() for k, v in new.state_dict().items()}, str(new_file))
    hf = HFEngine(str(tiny_model), model=model)
    prompts = chat_prompts(hf.tokenizer)

    res = run_vllm_script(
        HERE / "vllm_probe.py", cli_env, tiny_model, new_file, json.dumps(prompts)
    )

    assert max_delta(model, prompts, res["sampled_t1"], 1.0) <= LOGPROB_TOL
    assert max_delta(model, prompts, res["sampled_t08"], 0.8) <= LOGPROB_TOL

    def tokens(key):
        return [per_prompt[0]["tokens"] for per_prompt in res[key]]

    eos = hf.eos_id
    assert tokens("greedy_before") == [greedy_tokens(model, p, eos) for p in prompts]
    assert res["sum_changed"]
    assert tokens("greedy_new") == [greedy_tokens(new, p, eos) for p in prompts]
    assert tokens("greedy_new") != tokens("greedy_before")
    assert tokens("greedy_restored") == tokens("greedy_before")  # exactly the old outputs
    restored = np.concatenate([pp[0]["logprobs"] for pp in res["greedy_restored"]])
    before = np.concatenate([pp[0]["logprobs"] for pp in res["greedy_before"]])
    assert np.abs(restored - before).max() <= 1e-6, np.abs(restored - before).max()
    assert res["version"] == 2
