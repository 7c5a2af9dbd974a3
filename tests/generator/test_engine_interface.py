"""Every engine behind one interface (``engines.base.Engine``): the classes declare every member,
and one behavioural test runs for hf and vLLM-CPU alike, each in its own process through the
interface only (``engine_probe.py``): sampled log-probs equal a transformers forward pass (fp32,
max |Δ| ≤ 1e-4), greedy outputs equal greedy decoding; ``update_weights`` gives the new model's
outputs and ``load_file`` of the original gives exactly the old ones again; a stream given new
weights mid-response tags every token with the version that sampled it, its log-prob reproduced
by that version's weights (exactly with reset_kv; before the update without); a request aborted
mid-stream never comes back, and added again under its id decodes what greedy decoding does."""

import inspect
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from engine_checks import (
    LOGPROB_TOL,
    chat_prompts,
    check_versions_and_logprobs,
    max_delta,
    perturbed,
)
from testutil import greedy_tokens, run_vllm_script

from dapo_async.devices import engine_device
from dapo_async.engines import base
from dapo_async.engines.hf import HFEngine
from dapo_async.engines.hf_stream import HFStream
from dapo_async.engines.vllm import VLLMEngine
from dapo_async.engines.vllm_stream import VLLMStream

HERE = Path(__file__).resolve().parent


def _methods(protocol) -> dict:
    return {
        name: inspect.signature(member)
        for name, member in vars(protocol).items()
        if callable(member) and not name.startswith("_")
    }


@pytest.mark.parametrize(
    "cls, protocol",
    [(HFEngine, base.Engine), (VLLMEngine, base.Engine), (HFStream, base.Stream),
     (VLLMStream, base.Stream)],
)  # fmt: skip
def test_every_engine_declares_the_whole_interface(cls, protocol):
    for name, sig in _methods(protocol).items():
        assert hasattr(cls, name), f"{cls.__name__} lacks {name}"
        want = list(sig.parameters)
        got = list(inspect.signature(getattr(cls, name)).parameters)
        assert got[: len(want)] == want, (cls.__name__, name, got, want)
    assert isinstance(getattr(cls, "num_inflight", None), property) or protocol is base.Engine


@pytest.fixture(scope="module")
def new_weights(tiny_model, tmp_path_factory):
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model)).eval()
    states = {"old": {k: v.clone() for k, v in model.state_dict().items()}}
    states["new"] = perturbed(model)
    path = tmp_path_factory.mktemp("engine") / "new.safetensors"
    save_file({k: v.contiguous() for k, v in states["new"].items()}, str(path))
    return model, states, path


@pytest.mark.parametrize("kind", ["hf", pytest.param("vllm", marks=pytest.mark.slow)])
def test_engine_generates_streams_and_loads_weights(kind, tiny_model, new_weights, cli_env):
    model, states, path = new_weights
    tok = HFEngine(str(tiny_model), model=model).tokenizer
    prompts = chat_prompts(tok)
    res = run_vllm_script(HERE / "engine_probe.py", cli_env, kind, tiny_model, path,
                          json.dumps(prompts))  # fmt: skip

    attrs = res["attrs"]
    assert attrs["version"] == 0 and attrs["eos_id"] == tok.eos_token_id
    assert attrs["device"] == str(engine_device()) and attrs["decoded"] == tok.decode(prompts[0])

    model.load_state_dict(states["old"])
    assert max_delta(model, prompts, res["sampled"], 1.0) <= LOGPROB_TOL
    assert max_delta(model, prompts, res["sampled_t08"], 0.8) <= LOGPROB_TOL

    def tokens(key):
        return [per_prompt[0]["tokens"] for per_prompt in res[key]]

    eos = tok.eos_token_id
    assert tokens("greedy_before") == [greedy_tokens(model, p, eos) for p in prompts]
    model.load_state_dict(states["new"])
    assert tokens("greedy_new") == [greedy_tokens(model, p, eos) for p in prompts]
    assert tokens("greedy_new") != tokens("greedy_before")
    assert tokens("greedy_restored") == tokens("greedy_before")  # exactly the old outputs
    restored = np.concatenate([pp[0]["logprobs"] for pp in res["greedy_restored"]])
    before = np.concatenate([pp[0]["logprobs"] for pp in res["greedy_before"]])
    assert np.abs(restored - before).max() <= 1e-6

    for key, old, exact in (("stream_reset", 2, True), ("stream_kept", 4, False)):
        by_version = {old: states["old"], old + 1: states["new"]}
        with torch.no_grad():
            check_versions_and_logprobs(prompts[:4], res[key], by_version, model, exact)
    assert res["version"] == 5
    aborted = res["stream_abort"]  # greedy on the new weights, 3 requests
    assert aborted["inflight_after_abort"] <= 2, "the aborted request left at once"
    assert sorted(aborted["ids"]) == ["0", "1", "2"], "each returned once, the restart too"
    for i, want in enumerate(tokens("greedy_new")[:3]):
        assert aborted["tokens"][str(i)] == [want]
