"""The hf streaming decoder (continuous batching) with no update decodes what ``generate``
decodes, while requests join a running batch. Weight updates landing mid-response, for every
engine: test_engine_interface.py."""

import numpy as np
import torch
from engine_checks import LOGPROB_TOL, chat_prompts

from dapo_async.engines.base import SamplingParams
from dapo_async.engines.hf import HFEngine
from dapo_async.engines.hf_stream import _Seq


def _greedy(tiny_model, n: int):
    """(prompts, greedy params, what ``generate`` decodes for them, a stream of 3-token chunks)."""
    eng = HFEngine(str(tiny_model))
    prompts = chat_prompts(eng.tokenizer, n=n)
    greedy = SamplingParams(n=2, temperature=0.0, max_tokens=30)
    return prompts, greedy, eng.generate(prompts, greedy), eng.stream(chunk_tokens=3)


def test_hf_stream_decodes_what_generate_decodes_while_requests_join(tiny_model):
    prompts, greedy, ref, stream = _greedy(tiny_model, 8)
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


def test_hf_stream_abort_drops_a_requests_rows_and_it_can_start_over(tiny_model):
    prompts, greedy, ref, stream = _greedy(tiny_model, 4)
    for i, p in enumerate(prompts[:3]):
        stream.add_request(str(i), p, greedy)
    got = stream.step()
    stream.add_request("3", prompts[3], greedy)
    stream.abort("3")  # still pending: never admitted
    stream.abort("1")  # mid-response: its 2 rows leave the batch and its cache
    stream.abort("no-such-request")
    assert stream.num_inflight == 4 and len(stream.active) == 4
    assert stream.cache.layers[0].keys.shape[0] == 4 == stream.mask_BT.shape[0]
    got += stream.step()
    stream.add_request("1", prompts[1], greedy)  # the same id again, joining a running batch
    while stream.num_inflight:
        got += stream.step()
    assert sorted(rid for rid, _ in got) == ["0", "1", "2"]
    for rid, comps in got:
        assert [c.tokens.tolist() for c in comps] == [c.tokens.tolist() for c in ref[int(rid)]]


def test_hf_stream_prefills_a_prompt_shared_by_n_rows_once(tiny_model):
    """The n sequences of a request share their prompt: the prefill computes it once and copies
    its cache rows, giving each row what a prefill of every row computes."""
    prompts, greedy, _, stream = _greedy(tiny_model, 2)
    seqs = [
        _Seq("a", prompts[0]),
        _Seq("a", prompts[0]),
        _Seq("b", prompts[1]),
        _Seq("a", prompts[0]),
    ]
    cache, mask_BT, logits_BV = stream._prefill(seqs)
    assert stream.stats["prefill_tokens"] == len(prompts[0]) + len(prompts[1])
    ref_cache, ref_mask_BT, ref_logits_BV = stream._prefill_rows([s.prompt for s in seqs])
    assert torch.equal(mask_BT, ref_mask_BT)
    assert torch.allclose(logits_BV, ref_logits_BV, atol=1e-5)
    for layer, ref in zip(cache.layers, ref_cache.layers):
        assert layer.keys.shape == ref.keys.shape
        assert torch.allclose(layer.keys, ref.keys, atol=1e-5)
        assert torch.allclose(layer.values, ref.values, atol=1e-5)
