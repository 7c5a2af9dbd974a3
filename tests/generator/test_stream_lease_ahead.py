"""A stream left to drain before new prompts start (``refill_at`` below the target, the
default over the padded KV cache) asks for its next lease ahead of its end (``LEASE_AHEAD_AT``), holds the granted
prompts until the last row finishes, then starts them all. Real hf engine and decoder; no buffer (the sent messages are
captured, the grants set as the buffer's reply would set them)."""

from types import SimpleNamespace

from engine_checks import chat_prompts

from dapo_async import protocol
from dapo_async.config import load_config
from dapo_async.engines.base import SamplingParams
from dapo_async.engines.hf import HFEngine
from dapo_async.generator.main import make_loop
from dapo_async.generator.stream import LEASE_AHEAD_AT
from dapo_async.rollouts import load_rollout

N = 2  # responses a prompt
TARGET = 8  # sequences in flight: 4 prompts


def _loop(eng, overrides=()):
    cfg = load_config(
        None,
        [
            "generator.mode=stream",
            f"generator.responses_per_prompt={N}",
            f"generator.prompts_per_batch={TARGET // N}",
            "generator.refill_at=0",  # drain, then refill (said outright)
            *overrides,
        ],
    )
    params = SamplingParams(n=N, temperature=1.0, max_tokens=12)
    scorer = SimpleNamespace(component_names=("correct",))
    args = ("gen", eng, scorer, None, params, 1, 2.0)
    loop = make_loop(cfg, eng, args, {"rollout": load_rollout("")})
    loop.sent = []
    loop._send = loop.sent.append  # no buffer: keep what would go to it
    return loop


def _grant(loop, first_id: int, prompts) -> None:
    ids = list(range(first_id, first_id + len(prompts)))
    loop._grant = protocol.LeaseGrant(
        ids, prompts, ["0"] * len(prompts), ["t"] * len(prompts), 0, min_version=0
    )
    loop.lease_pending = True  # as after the request the grant answers
    loop._refill()


def test_a_draining_stream_asks_ahead_and_starts_the_grant_once_empty(tiny_model):
    eng = HFEngine(str(tiny_model))
    loop = _loop(eng)
    assert loop.refill_at == 0 and loop.ask_at == int(LEASE_AHEAD_AT * TARGET) == N
    prompts = chat_prompts(eng.tokenizer, 5)
    _grant(loop, 0, prompts[:1])  # one prompt: N rows, at the ask-ahead level
    assert loop.stream.num_inflight == N  # an empty stream starts it at once
    # ... and asks now for a whole batch: the N rows in flight will be gone when it starts
    assert [type(m) for m in loop.sent] == [protocol.LeaseRequest]
    assert loop.sent[0].num_prompts == TARGET // N
    _grant(loop, 1, prompts[1:5])
    assert loop.stream.num_inflight == N and len(loop.waiting) == TARGET // N  # held
    assert len(loop.sent) == 1  # nothing more asked while a batch waits
    done = []
    while loop.waiting:
        assert loop.stream.num_inflight <= N  # nothing joins the draining batch
        loop._mark_started()  # what StreamLoop.step does before a chunk
        done += loop.stream.step()
        loop._refill()
    assert [rid for rid, _ in done] == ["gen:0"]
    assert loop.stream.num_inflight == TARGET  # started together, once the stream was empty
    assert loop._unstarted == [f"gen:{i}" for i in range(1, 5)]  # added since the last chunk
    loop.stream.close()


def test_a_full_stream_does_not_ask(tiny_model):
    eng = HFEngine(str(tiny_model))
    loop = _loop(eng)
    _grant(loop, 0, chat_prompts(eng.tokenizer, TARGET // N))
    assert loop.stream.num_inflight == TARGET and loop.sent == []
    loop.stream.close()


def test_a_continuous_stream_starts_what_it_is_granted_at_once(tiny_model):
    eng = HFEngine(str(tiny_model))
    loop = _loop(eng, ["generator.refill_at=1.0"])
    assert loop.refill_at == loop.ask_at == TARGET
    prompts = chat_prompts(eng.tokenizer, 2)
    _grant(loop, 0, prompts[:1])
    _grant(loop, 1, prompts[1:])
    assert loop.stream.num_inflight == 2 * N and not loop.waiting
    loop.stream.close()


def test_auto_refill_is_continuous_where_each_sequence_has_its_own_kv_slot(tiny_model):
    """``generator.refill_at=-1`` on a CPU: continuous where the stream's cache is the slot
    cache (a refill costs only its new rows), drain first over the padded cache."""
    eng = HFEngine(str(tiny_model))
    eng.decode_attention_kernel = True  # as engine_for sets it on a CPU: the slot cache
    slotted = _loop(eng, ["generator.refill_at=-1"])
    assert slotted.refill_at == TARGET
    slotted.stream.close()
    eng.decode_attention_kernel = False  # torch's attention: the padded cache
    padded = _loop(eng, ["generator.refill_at=-1"])
    assert padded.refill_at == 0
    padded.stream.close()
