"""The hf streaming decoder (continuous batching) with no update decodes what ``generate``
decodes, while requests join a running batch. Weight updates landing mid-response, for every
engine: test_engine_interface.py."""

import numpy as np
from engine_checks import LOGPROB_TOL, chat_prompts

from dapo_async.engines.base import SamplingParams
from dapo_async.engines.hf import HFEngine


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
