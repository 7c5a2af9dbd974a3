"""The hf engine's batch and streaming paths with the model on a simulated accelerator
(tests/simdevice.py: ``meta`` computes like the CPU and fails like CUDA): every tensor and the
sampling generator the decoders make must be on the model's device, and the streaming decoder
reads sampled tokens back to the host once per few steps, not once per token."""

import numpy as np
from engine_checks import LOGPROB_TOL, chat_prompts, max_delta
from simdevice import real, sim_device

from dapo_async.engines import hf_stream
from dapo_async.engines.base import SamplingParams
from dapo_async.engines.hf import HFEngine


def _decode(stream, prompts, params):
    got = {}
    for i, p in enumerate(prompts):  # one new request per chunk: joins a running batch
        stream.add_request(str(i), p, params)
        got.update(stream.step())
    while stream.num_inflight:
        got.update(stream.step())
    return [got[str(i)] for i in range(len(prompts))]


def test_hf_stream_decodes_on_the_models_device(tiny_model):
    cpu = HFEngine(str(tiny_model))
    prompts = chat_prompts(cpu.tokenizer, n=6)
    greedy = SamplingParams(n=2, temperature=0.0, max_tokens=30)
    sampled = SamplingParams(n=2, temperature=1.0, max_tokens=30)
    ref = cpu.generate(prompts, greedy)
    with sim_device() as sim:
        eng = HFEngine(str(tiny_model), device="meta")
        assert next(eng.model.parameters()).device.type == "meta"
        got = _decode(eng.stream(chunk_tokens=16), prompts, greedy)
        stream = eng.stream(chunk_tokens=16, seed=1)
        reads_before = sim.host_reads
        comps = _decode(stream, prompts, sampled)
        reads = sim.host_reads - reads_before
    for a_n, b_n in zip(ref, got):
        for a, b in zip(a_n, b_n):
            assert a.tokens.tolist() == b.tokens.tolist()
            assert np.abs(a.logprobs - b.logprobs).max() <= LOGPROB_TOL
    assert max_delta(cpu.model, prompts, comps, 1.0) <= LOGPROB_TOL
    steps = stream.stats["decode_steps"]
    # one read per GPU_HOST_CHECK steps, plus one per prefill and per cache trim (here 26 in
    # 111 steps); reading every sampled token (or letting transformers check the 2-D padding
    # mask) costs at least one per step
    assert hf_stream.GPU_HOST_CHECK >= 4 and reads <= steps / 2, (reads, steps)


def test_hf_generate_and_weight_updates_on_the_models_device(tiny_model):
    cpu = HFEngine(str(tiny_model))
    prompts = chat_prompts(cpu.tokenizer, n=4)
    params = SamplingParams(n=2, temperature=1.0, max_tokens=20, seed=0)
    new_state = {k: v * 0.9 for k, v in cpu.model.state_dict().items()}  # host tensors
    with sim_device():
        eng = HFEngine(str(tiny_model), device="meta")
        eng.update_weights(new_state, version=3)  # weights arrive on the host
        comps = eng.generate(prompts, params)
        weights = {k: real(v).clone() for k, v in eng.model.state_dict().items()}
    assert eng.version == 3
    cpu.update_weights(weights, version=3)
    assert max_delta(cpu.model, prompts, comps, 1.0) <= LOGPROB_TOL
