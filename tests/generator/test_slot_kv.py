"""The slot cache (``engines/slot_kv.py``): a stream that keeps each sequence in its own slot
samples what the padded batch samples while rows join a running batch, leave it, are aborted
and are recomputed after new weights; a row that leaves frees its slot for the next one without
a copy; buffers grow in time without losing what they hold."""

from __future__ import annotations

import shutil

import pytest
import torch
from test_lean_decode import Engine, model_of

from dapo_async.engines.base import SamplingParams
from dapo_async.engines.hf_stream import HFStream
from dapo_async.engines.slot_kv import SlotKV

pytestmark = pytest.mark.skipif(
    shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler here"
)


def params(n: int, max_tokens: int) -> SamplingParams:
    return SamplingParams(n=n, temperature=1.0, top_p=1.0, top_k=-1, max_tokens=max_tokens)


def run_schedule(slots: bool, reset_kv: bool) -> dict:
    """Requests added while others decode, one aborted, new weights mid-run; what finished."""
    engine = Engine(model_of("llama"), kernel=True)
    s = HFStream(engine, chunk_tokens=3, seed=5, lean=True, reset_kv=reset_kv)
    assert (s.slots is not None) is True
    if not slots:
        s.slots = None  # the padded batch
    s.add_request("a", [5, 6, 7], params(3, 14))
    s.add_request("b", [9, 10], params(2, 6))
    done = s.step()
    s.add_request("c", [11, 12, 13, 14, 15], params(2, 20))  # joins a running batch
    done += s.step()
    s.add_request("d", [7], params(4, 9))
    s.abort("a")  # its three rows leave between steps
    done += s.step()
    with torch.no_grad():  # new weights: a reset_kv stream recomputes every row's cache
        for p in engine.model.parameters():
            p.mul_(0.97)
    engine.version = 1
    s.add_request("e", [20, 21, 22, 23], params(2, 12))
    while s.num_inflight:
        done += s.step()
    return {rid: [(c.tokens.tolist(), c.logprobs, c.finish) for c in cs] for rid, cs in done}


@pytest.mark.parametrize("reset_kv", [False, True], ids=["kept-kv", "reset-kv"])
def test_slots_sample_what_the_padded_batch_samples(reset_kv):
    padded, slotted = run_schedule(False, reset_kv), run_schedule(True, reset_kv)
    assert sorted(slotted) == sorted(padded) == ["b", "c", "d", "e"]
    for rid, comps in padded.items():
        for (tok_a, lp_a, fin_a), (tok_b, lp_b, fin_b) in zip(comps, slotted[rid], strict=True):
            assert tok_a == tok_b and fin_a == fin_b
            assert abs(lp_a - lp_b).max() < 1e-5


def test_a_row_that_leaves_frees_its_slot_and_buffers_grow_in_time():
    class Layer:
        def __init__(self, k):
            self.keys, self.values = k, -k

    class Cache:
        def __init__(self, k):
            self.layers = [Layer(k), Layer(2 * k)]

    kv = SlotKV(layers=2, kv_heads=1, head_dim=2)
    k_BKTD = torch.arange(2 * 1 * 3 * 2, dtype=torch.float32).reshape(2, 1, 3, 2) + 1
    mask_BT = torch.tensor([[0, 1, 1], [1, 1, 1]])  # row 0 left-padded: 2 tokens
    kv.add(Cache(k_BKTD), mask_BT, [0, 1, 1], room=1)
    assert kv.slot_B.tolist() == [0, 1, 2] and kv.len_B.tolist() == [2, 3, 3]
    assert torch.equal(kv.keys[0][0, :, :2], k_BKTD[0, :, 1:])  # its padding left behind
    assert torch.equal(kv.values[1][2, :, :3], -2 * k_BKTD[1])
    held = kv.keys[0].data_ptr()
    kv.keep([2, 0])  # row 1 leaves: its slot is free, nothing moved
    assert kv.slot_B.tolist() == [2, 0] and kv.len_B.tolist() == [3, 2]
    assert kv.free == [1] and kv.keys[0].data_ptr() == held
    kv.add(Cache(k_BKTD), mask_BT, [0], room=1)  # the freed slot is taken again
    assert kv.slot_B.tolist() == [2, 0, 1] and kv.time == 4 and kv.slots == 3
    before = kv.keys[1].clone()
    for step in range(3):  # the longest row outgrows 4 time slots: the buffers grow
        kv.step_positions()
        for layer in range(2):
            kv.write(torch.full((3, 1, 1, 2), 100.0 + step), torch.zeros(3, 1, 1, 2), layer)
        kv.advance()
    assert kv.time > 4 and kv.len_B.tolist() == [6, 5, 5]
    assert torch.equal(kv.keys[1][:, :, :2], before[:, :, :2])  # what it held is kept
    assert torch.equal(kv.keys[0][2, 0, 3:6, 0], torch.tensor([100.0, 101.0, 102.0]))
