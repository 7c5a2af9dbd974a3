"""The stream loop restarts a request that can no longer be trained (``generator/stream.py``):
one begun under weights older than the learner's version minus the buffer's staleness bound
(the grant says both) starts over from its prompt under the current weights, keeping its lease;
one that can still be trained is left alone. Real hf engine and decoder; no buffer (the loop's
grant is set as the buffer's reply would set it)."""

from types import SimpleNamespace

from engine_checks import chat_prompts

from dapo_async import protocol
from dapo_async.config import load_config
from dapo_async.engines.base import SamplingParams
from dapo_async.engines.hf import HFEngine
from dapo_async.generator.main import make_loop
from dapo_async.rollouts import load_rollout


def _loop(tiny_model):
    eng = HFEngine(str(tiny_model))
    # 2 tokens a chunk: no response ends in the few chunks decoded before the checks
    cfg = load_config(None, ["generator.mode=stream", "generator.update_interval_tokens=2"])
    params = SamplingParams(n=2, temperature=1.0, max_tokens=40)
    scorer = SimpleNamespace(component_names=("correct",))
    args = ("gen", eng, scorer, None, params, 1, 2.0)
    loop = make_loop(cfg, eng, args, {"rollout": load_rollout("")})
    loop.ask_at = -1  # no lease requests: there is no buffer to ask
    loop.refill_at = loop.target  # a grant starts at once, whatever is in flight
    return loop, eng


def _grant(loop, lease_id: int, prompt, version: int, max_staleness: int) -> None:
    loop._grant = protocol.LeaseGrant(
        [lease_id], [prompt], ["0"], ["t"], version, min_version=0, max_staleness=max_staleness
    )
    loop._refill()


def _chunk(loop):
    """What ``StreamLoop.step`` does around a decode chunk, without the buffer's messages."""
    loop._mark_started()
    loop._restart_late()
    return loop.stream.step()


def test_a_request_too_stale_to_train_starts_over_under_the_current_weights(tiny_model):
    loop, eng = _loop(tiny_model)
    prompts = chat_prompts(eng.tokenizer, 2)
    state = {k: v.clone() for k, v in eng.model.state_dict().items()}
    _grant(loop, 0, prompts[0], version=0, max_staleness=1)  # "gen:0" under version 0
    done = _chunk(loop)
    eng.update_weights(state, 1)
    _grant(loop, 1, prompts[1], version=1, max_staleness=1)  # "gen:1" under version 1
    loop._restart_late()
    assert loop.counters["restarted"] == 0  # v0 ≥ 1 − 1: both can still be trained
    done += _chunk(loop)
    loop.learner_version = 3  # the learner moved on (a later grant says so) ...
    loop._restart_late()
    assert loop.counters["restarted"] == 0  # ... but a restart under v1 would be too old again
    loop.learner_version = 2
    loop._restart_late()
    assert done == [] and loop.counters["restarted"] == 1  # gen:0 began under v0 < 2 − 1
    assert loop.started == {"gen:0": 1, "gen:1": 1}
    assert set(loop.inflight) == {"gen:0", "gen:1"}  # the lease is kept
    assert loop.stream_metrics()["generator/restarted"] == 1.0
    while loop.stream.num_inflight:
        done += _chunk(loop)
    got = dict(done)
    assert sorted(got) == ["gen:0", "gen:1"]  # each once: the aborted start never came back
    for c in got["gen:0"] + got["gen:1"]:
        assert set(c.versions.tolist()) == {1}  # every token from weights still trainable
    loop.stream.close()


def test_without_a_staleness_bound_from_the_buffer_nothing_restarts(tiny_model):
    loop, eng = _loop(tiny_model)
    prompts = chat_prompts(eng.tokenizer, 1)
    _grant(loop, 0, prompts[0], version=0, max_staleness=-1)  # an older buffer: not said
    loop.stream.step()
    eng.update_weights({k: v.clone() for k, v in eng.model.state_dict().items()}, 5)
    loop.learner_version = 5
    loop._restart_late()
    assert loop.counters["restarted"] == 0 and loop.started == {"gen:0": 0}
    loop.stream.close()  # the episode still in flight: cancelled, nothing left pending


def test_a_request_starts_under_the_weights_of_its_first_chunk(tiny_model):
    """A spare generator adds its granted prompts, then parks before decoding them, taking
    weights meanwhile: their first tokens come from the newer weights, and it is by those
    that they are judged (not restarted while they can still be trained)."""
    loop, eng = _loop(tiny_model)
    prompts = chat_prompts(eng.tokenizer, 1)
    _grant(loop, 0, prompts[0], version=0, max_staleness=1)  # added under v0 ...
    eng.update_weights({k: v.clone() for k, v in eng.model.state_dict().items()}, 2)
    _chunk(loop)  # ... first decoded under v2 (the park took weights)
    assert loop.started == {"gen:0": 2}
    loop.learner_version = 3
    _chunk(loop)
    assert loop.counters["restarted"] == 0  # v2 ≥ 3 − 1: still trainable
    loop.stream.close()
