"""Streaming decoders (continuous batching) against a transformers forward pass: with no update
they decode what ``generate`` decodes; with a weight update landing mid-response, every token
carries the version that sampled it and its recorded log-prob is reproduced by that version's
weights (exactly with reset_kv; with the kept KV cache, exactly for the tokens before it)."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from test_engines import LOGPROB_TOL, chat_prompts
from testutil import run_vllm_script

from dapo_async.engines.base import SamplingParams
from dapo_async.engines.hf import HFEngine

HERE = Path(__file__).resolve().parent


def perturbed(model, scale=0.05):
    """A copy of ``model``'s weights with noise: the 'new version' (noise per parameter, so
    tied embeddings stay tied)."""
    import copy

    new = copy.deepcopy(model)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(scale * torch.randn_like(p))
    return {k: v.clone() for k, v in new.state_dict().items()}


def logprob_at(state, model, prompt, tokens, t):
    """log π_state(tokens[t] | prompt, tokens[:t]) (temperature 1)."""
    model.load_state_dict(state)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([list(prompt) + list(tokens[:t])])).logits[0, -1]
    return float(torch.log_softmax(logits.float(), -1)[tokens[t]])


def check_versions_and_logprobs(prompts, results, states, model, exact_after_update: bool):
    spanned = 0
    for prompt, comps in zip(prompts, results):
        assert len(comps) == 2, "every request returns its n responses"
        for c in comps:
            tokens, logps, versions = c["tokens"], c["logprobs"], c["versions"]
            assert versions == sorted(versions) and set(versions) <= {0, 1}
            spanned += len(set(versions)) == 2
            for t, v in enumerate(versions):
                if v == 1 and not exact_after_update:
                    continue
                ref = logprob_at(states[v], model, prompt, tokens, t)
                assert abs(ref - logps[t]) <= LOGPROB_TOL, (t, v, ref, logps[t])
    assert spanned >= 2, "no response spanned the update"


def test_hf_stream_decodes_what_generate_decodes_while_requests_join(tiny_model):
    eng = HFEngine(str(tiny_model))
    prompts = chat_prompts(eng.tokenizer, n=8)
    greedy = SamplingParams(n=2, temperature=0.0, max_tokens=30)
    ref = eng.generate(prompts, greedy)
    stream = eng.stream(chunk_tokens=3)
    got = {}
    for i, p in enumerate(prompts):  # one new request per chunk: joins a running batch
        stream.add_request(str(i), p, greedy)
        got.update(stream.step())
    while stream.num_inflight:
        got.update(stream.step())
    for i in range(len(prompts)):
        for a, b in zip(ref[i], got[str(i)]):
            assert a.tokens.tolist() == b.tokens.tolist()
            assert np.abs(a.logprobs - b.logprobs).max() <= LOGPROB_TOL


@pytest.mark.parametrize("reset_kv", [True, False])
def test_hf_weight_update_mid_response(tiny_model, reset_kv):
    eng = HFEngine(str(tiny_model))
    model = eng.model
    states = {0: {k: v.clone() for k, v in model.state_dict().items()}, 1: perturbed(model)}
    prompts = chat_prompts(eng.tokenizer, n=4)
    params = SamplingParams(n=2, temperature=1.0, max_tokens=30)
    stream = eng.stream(chunk_tokens=4, reset_kv=reset_kv, seed=1)
    for i, p in enumerate(prompts):
        stream.add_request(str(i), p, params)
    done = dict(stream.step())
    eng.update_weights(states[1], 1)
    while stream.num_inflight:
        done.update(stream.step())
    results = [
        [
            {"tokens": c.tokens.tolist(), "logprobs": c.logprobs.tolist(),
             "versions": c.versions.tolist()}
            for c in done[str(i)]
        ]
        for i in range(len(prompts))
    ]  # fmt: skip
    check_versions_and_logprobs(prompts, results, states, model, exact_after_update=reset_kv)


@pytest.mark.slow
@pytest.mark.parametrize("reset_kv", [True, False])
def test_vllm_cpu_weight_update_mid_response(tiny_model, tmp_path, cli_env, reset_kv):
    from safetensors.torch import save_file

    eng = HFEngine(str(tiny_model))
    model = eng.model
    states = {0: {k: v.clone() for k, v in model.state_dict().items()}, 1: perturbed(model)}
    new_file = tmp_path / "new.safetensors"
    save_file({k: v.contiguous() for k, v in states[1].items()}, str(new_file))
    prompts = chat_prompts(eng.tokenizer, n=4)
    results = run_vllm_script(
        HERE / "vllm_stream_probe.py", cli_env, tiny_model, new_file, json.dumps(prompts),
        "1" if reset_kv else "0",
    )  # fmt: skip
    check_versions_and_logprobs(prompts, results, states, model, exact_after_update=reset_kv)
