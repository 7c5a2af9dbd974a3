"""Rollout functions (``dapo_async.rollouts``): episodes played token in, token out; their turns
batched into engine calls; environment tokens marked unsampled on the way to the learner; the
behaviour log-probs of every sampled token across three turns equal what the learner computes at
the same weights, on the hf and vLLM-CPU engines; an episode spanning a weight update carries
two versions and the buffer judges it by the oldest."""

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from engine_checks import chat_prompts
from testutil import run_vllm_script

from dapo_async import protocol as P
from dapo_async.engines.base import Completion, SamplingParams
from dapo_async.generator.rollout import make_group
from dapo_async.rollouts import (
    Episode,
    EpisodeRunner,
    RolloutError,
    Sample,
    Trajectory,
    Turn,
    check_trajectory,
    load_rollout,
    single_turn,
)

HERE = Path(__file__).resolve().parent
# float32 on both sides: behaviour and learner log-probs of a sampled token agree to this
MULTI_TURN_TOL = 1e-5


class ScriptedEngine:
    """A hand-written engine: every call answers each prompt with the next scripted token list
    (log-prob -0.5 a token) and records (prompts, n, stop ids)."""

    def __init__(self, script, eos_id=2):
        self.script = list(script)
        self.calls = []
        self.version = 0
        self.eos_id = eos_id
        self.tokenizer = None

    def generate(self, prompts, params):
        self.calls.append(([list(p) for p in prompts], params.n, params.stop_token_ids))
        toks = self.script.pop(0) if self.script else [self.eos_id]
        return [
            [
                Completion(np.asarray(toks, np.int32), np.full(len(toks), -0.5, np.float32), "stop")
                for _ in range(params.n)
            ]
            for _ in prompts
        ]


def _groups(prompts, trajs, g):
    """make_group per prompt, then through the wire (encode, decode): what the buffer sends."""
    groups = []
    for i, p in enumerate(prompts):
        comps = [t.completion() for t in trajs[i * g : (i + 1) * g]]
        scored = [SimpleNamespace(reward=float(k % 2), acc=float(k % 2), components=[0.0])
                  for k in range(g)]  # fmt: skip
        groups.append(make_group("t", i, i, p, comps, scored, 0))
    frames = P.encode(P.ScoredGroups(batch=P.GroupBatch.from_groups(groups, ["x"])))
    return list(P.decode([bytes(memoryview(f).cast("B")) for f in frames]).batch)


@pytest.mark.parametrize("mode", ["batch", "stream"])
@pytest.mark.parametrize("kind", ["hf", pytest.param("vllm", marks=pytest.mark.slow)])
def test_three_turn_behaviour_logprobs_equal_the_learners(kind, mode, tiny_model, cli_env):
    from transformers import AutoModelForCausalLM

    from dapo_async.engines.hf import HFEngine
    from dapo_async.learner.batching import collate, groups_to_rows
    from dapo_async.learner.logprobs import ResponseLogProbs

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model)).eval()
    tok = HFEngine(str(tiny_model), model=model).tokenizer
    prompts = chat_prompts(tok, 4)
    res = run_vllm_script(HERE / "rollout_probe.py", cli_env, kind, tiny_model,
                          json.dumps(prompts), mode)  # fmt: skip
    if mode == "batch":
        assert res["engine_calls"] == 3  # one engine call a turn for all 8 episodes
    env = tok("|ok|", add_special_tokens=False).input_ids
    trajs = []
    for e in res["episodes"]:
        sampled = np.asarray(e["sampled"], np.uint8)
        assert int((sampled == 0).sum()) == 2 * len(env)  # two environment turns
        assert np.all(np.asarray(e["logprobs"])[sampled == 0] == 0.0)
        trajs.append(Trajectory(*(np.asarray(e[k]) for k in ("tokens", "logprobs", "versions")),
                                sampled=sampled, finish=e["finish"], text="x"))  # fmt: skip
    rows = groups_to_rows(_groups(prompts, trajs, 2))
    mb = collate(rows, np.arange(len(rows)), pad_id=tok.pad_token_id)
    t = mb.mask_BT.shape[1]
    with torch.no_grad():
        logp, _ = ResponseLogProbs(model, 0)(
            mb.input_ids_BL, mb.attention_BL, mb.resp_start_B, mb.resp_len_B, t, 1.0, "none"
        )
    on = mb.mask_BT > 0
    assert int(on.sum()) == sum(int(np.sum(e["sampled"])) for e in res["episodes"])
    delta = (logp - mb.behav_logp_BT)[on].abs().max().item()
    print(f"[{kind} {mode}] max |behaviour - learner| over 3 turns: {delta:.2e}")
    assert delta <= MULTI_TURN_TOL


def test_the_default_rollout_makes_the_batch_loops_one_call():
    """single_turn through the runner: P prompts × G responses are one engine call with n = G,
    every token sampled (no mask travels)."""
    eng = ScriptedEngine([[5, 6, 2]])
    runner = EpisodeRunner(single_turn, eng, SamplingParams(max_tokens=8))
    prompts = [[1, 7], [1, 8], [1, 9]]
    trajs = runner.run([Sample(p, index=i) for p in prompts for i in range(4)])
    assert eng.calls == [(prompts, 4, ())]
    assert all(t.sampled is None and t.tokens.tolist() == [5, 6, 2] for t in trajs)


def test_both_loops_play_the_default_rollout_function():
    """No separate single-turn path: with no `generator.rollout`, the batch loop's runner and the
    stream loop's EpisodeStream both play `single_turn` episodes (the stream over the engine's
    own continuous-batching decoder)."""
    from dapo_async.config import load_config
    from dapo_async.generator.episode_stream import EpisodeStream
    from dapo_async.generator.main import make_loop

    inner = SimpleNamespace(num_inflight=0)
    eng = ScriptedEngine([])
    eng.stream = lambda *args: inner
    scorer = SimpleNamespace(component_names=("correct",))
    args = ("gen", eng, scorer, None, SamplingParams(n=2), 1, 2.0)
    rollout = load_rollout("")
    for mode in ("batch", "stream"):
        loop = make_loop(
            load_config(None, [f"generator.mode={mode}"]), eng, args, {"rollout": rollout}
        )
        assert loop.runner.fn is single_turn
        if mode == "stream":
            assert isinstance(loop.stream, EpisodeStream)
            assert loop.stream.fn is single_turn and loop.stream.inner is inner


def test_closing_the_episode_stream_cancels_the_episodes_still_playing(caplog):
    """At the end of a run the episodes still in flight are cancelled and the event loop
    closed: nothing is left pending for the interpreter to report ('Task was destroyed')."""
    import gc

    from dapo_async.generator.episode_stream import EpisodeStream

    class NeverDone:  # an engine stream whose turns never finish
        num_inflight = 0

        def add_request(self, rid, ids, params):
            self.num_inflight += 1

        def step(self):
            return []

    eng = ScriptedEngine([])
    stream = EpisodeStream(NeverDone(), _two_turns, eng, tokenizer=object())
    stream.add_request("r", [1, 2], SamplingParams(n=3))
    stream.step()
    assert stream.num_inflight == 3  # each waits on its first turn
    tasks = [t for t, _ in stream.episodes["r"]]
    stream.close()
    assert all(t.cancelled() for t in tasks) and stream.loop.is_closed()
    stream.close()  # twice is harmless
    del stream, tasks
    gc.collect()
    assert "Task was destroyed" not in caplog.text


async def _two_turns(ctx, sample):
    ep = Episode(sample.prompt_tokens)
    ep.add_turn(await ctx.generate(ep.tokens, stop_token_ids=(9,)))
    ep.add_env([40, 41])
    ep.add_turn(await ctx.generate(ep.tokens))
    return ep.trajectory(info={"turns": 2.0})


def test_an_episode_spanning_a_weight_update_is_judged_by_its_oldest_version():
    from dapo_async.buffer.state import BufferState
    from dapo_async.config import BufferConfig

    eng = ScriptedEngine([[5, 9], [6, 2]])

    def new_weights():  # between the turns, as generator.inflight_updates lets them land
        eng.version += 1

    eng.version = 1
    runner = EpisodeRunner(_two_turns, eng, SamplingParams(max_tokens=8), between_turns=new_weights)
    trajs = runner.run([Sample([1, 7], index=i) for i in range(2)])
    t = trajs[0]
    assert t.tokens.tolist() == [5, 9, 40, 41, 6, 2]
    assert t.versions.tolist() == [1, 1, 1, 1, 2, 2]  # the environment's: the turn it answers
    assert t.sampled.tolist() == [1, 1, 0, 0, 1, 1] and t.logprobs[2:4].tolist() == [0.0, 0.0]
    assert eng.calls[0][2] == (9,)  # the turn's stop token reached the engine

    def buffer_at(step):
        s = BufferState(BufferConfig(groups_per_step=1, max_staleness=1), num_prompts=10, seed=0,
                        component_names=["x"])  # fmt: skip
        s.hello("t")
        (lease,) = s.grant("t", 1)
        (g,) = _groups([[1, 7]], trajs, 2)
        g.prompt_id, g.generator_id = lease.lease_id, "t"
        s.version = step
        assert s.ingest(g) == "stored"
        return s, s.batch(step, 0, 1)

    _, ok = buffer_at(2)  # oldest token v1 >= 2 - 1: trained
    assert ok is not None
    s, refused = buffer_at(3)  # oldest v1 < 3 - 1, although its newest (v2) would be allowed
    assert refused is None and s.counters.dropped["stale"] == 1


def test_plain_rollout_functions_and_clear_errors():
    def plain(ctx, sample):
        ep = Episode(sample.prompt_tokens)
        ep.add_turn(ctx.generate(ep.tokens))
        ep.add_env([3])
        ep.add_turn(ctx.generate(ep.tokens, max_tokens=1))
        return ep.trajectory()

    eng = ScriptedEngine([[5, 2], [6], [5, 2], [6]])
    trajs = EpisodeRunner(plain, eng, SamplingParams(max_tokens=8)).run(
        [Sample([1], index=i) for i in range(2)]
    )
    assert [t.sampled.tolist() for t in trajs] == [[1, 1, 0, 1]] * 2

    async def returns_text(ctx, sample):
        await ctx.generate(sample.prompt_tokens)
        return "hello"

    async def raises(ctx, sample):
        raise KeyError("tool")

    for fn, words in ((returns_text, "not a Trajectory"), (raises, "KeyError")):
        with pytest.raises(RolloutError, match=words):
            EpisodeRunner(fn, ScriptedEngine([[5]]), SamplingParams()).run([Sample([1])])
    with pytest.raises(RolloutError, match="must open with a sampled turn"):
        Episode([1]).add_env([3])
    for path, words in (("nocolon", "package.module:function"),
                        ("dapo_async.nope:fn", "cannot import"), ("math:pi", "not callable")):  # fmt: skip
        with pytest.raises(RolloutError, match=words):
            load_rollout(path)
    assert load_rollout("") is single_turn


def test_the_episode_budget_counts_sampled_tokens_only():
    """generator.max_tokens bounds what the policy samples in an episode, across its turns."""
    eng = ScriptedEngine([[5, 6, 7], [8, 9]])
    runner = EpisodeRunner(_two_turns, eng, SamplingParams(max_tokens=5))
    (t,) = runner.run([Sample([1])])
    assert t.tokens.tolist() == [5, 6, 7, 40, 41, 8, 9]
    assert eng.calls[1][0] == [[1, 5, 6, 7, 40, 41]]  # token in: the exact tokens so far
    assert t.completion().num_sampled == 5


def test_sampled_mask_travels_and_is_checked_on_the_wire():
    trajs = [Trajectory(np.array([5, 9, 40, 6]), np.array([-1, -1, 0, -1], np.float32),
                        np.zeros(4, np.int32), np.array([1, 1, 0, 1], np.uint8), "stop", "t")
             ] * 2  # fmt: skip
    (g,) = _groups([[1, 7]], trajs, 2)
    assert g.sampled.tolist() == [1, 1, 0, 1] * 2
    for bad, words in (([1, 1, 2, 1], "0 or 1"), ([0, 1, 1, 1], "start with a sampled token")):
        g2 = make_group("t", 0, 0, [1], [trajs[0].completion()], [SimpleNamespace(
            reward=0.0, acc=0.0, components=[0.0])], 0)  # fmt: skip
        g2.sampled = np.asarray(bad, np.uint8)
        with pytest.raises(P.ProtocolError, match=words):
            P.GroupBatch.from_groups([g2], ["x"]).validate()


async def _slow_or_fast(ctx, sample):
    """Six turns for a request marked slow, one otherwise; the environment says "|" between."""
    ep = Episode(sample.prompt_tokens)
    turns = 6 if sample.extra.get("slow") else 1
    for k in range(turns):
        ep.add_turn(await ctx.generate(ep.tokens, max_tokens=4))
        if k < turns - 1:
            ep.add_env(ctx.encode("|"))
    return ep.trajectory()


def test_stream_mode_a_slow_episode_holds_no_other_and_updates_land_between_turns(tiny_model):
    """Episodes on the hf engine's continuous-batching decoder: a one-turn request comes back
    while a six-turn one plays on; weights given mid-episode tag the later turns with the new
    version, the environment's tokens with the version of the turn they answer."""
    from transformers import AutoModelForCausalLM

    from dapo_async.engines.hf import HFEngine
    from dapo_async.generator.episode_stream import EpisodeStream
    from dapo_async.rollouts import Sample as S

    eng = HFEngine(str(tiny_model), model=AutoModelForCausalLM.from_pretrained(str(tiny_model)))
    prompts = chat_prompts(eng.tokenizer, 2)
    stream = EpisodeStream(eng.stream(4, seed=0), _slow_or_fast, eng)
    params = SamplingParams(n=2, temperature=1.0, max_tokens=40)
    stream.add_request("slow", prompts[0], params, S(prompts[0], extra={"slow": True}))
    stream.add_request("fast", prompts[1], params, S(prompts[1]))
    order, done, steps = [], {}, 0
    state = {k: v + 0.01 for k, v in eng.model.state_dict().items()}
    while stream.num_inflight:
        for rid, comps in stream.step():
            order.append((rid, steps))
            done[rid] = comps
        steps += 1
        if steps == 2:
            eng.update_weights(state, 1)
    assert [rid for rid, _ in order] == ["fast", "slow"] and order[0][1] < order[1][1]
    for c in done["slow"]:
        env = c.sampled == 0
        assert int(env.sum()) == 5 and set(c.versions.tolist()) == {0, 1}
        before = np.concatenate([[c.versions[0]], c.versions[:-1]])
        assert np.array_equal(c.versions[env], before[env])  # the turn each one answers
    assert all(c.sampled is None or c.sampled.all() for c in done["fast"])


def test_aborting_an_episode_cancels_it_and_drops_its_turn_from_the_engine(tiny_model):
    """``EpisodeStream.abort`` mid-episode (the generator restarts a request too stale to be
    trained): its episodes are cancelled, the turns they waited on leave the hf decoder's batch,
    nothing comes back for it, and the same id added again plays its episodes from the start."""
    from transformers import AutoModelForCausalLM

    from dapo_async.engines.hf import HFEngine
    from dapo_async.generator.episode_stream import EpisodeStream
    from dapo_async.rollouts import Sample as S

    eng = HFEngine(str(tiny_model), model=AutoModelForCausalLM.from_pretrained(str(tiny_model)))
    prompts = chat_prompts(eng.tokenizer, 2)
    stream = EpisodeStream(eng.stream(4, seed=0), _slow_or_fast, eng)
    params = SamplingParams(n=2, temperature=1.0, max_tokens=40)
    slow = S(prompts[0], extra={"slow": True})
    stream.add_request("slow", prompts[0], params, slow)
    stream.add_request("fast", prompts[1], params, S(prompts[1]))
    done = [*stream.step(), *stream.step()]  # the slow episodes are in their turns now
    tasks = [t for t, _ in stream.episodes["slow"]]
    waiting = len(stream.turns)  # each slow episode waits on a turn (queued or decoding)
    assert waiting >= 2 and stream.inner.num_inflight + len(stream.queued) == waiting
    stream.abort("slow")
    assert all(t.cancelled() for t in tasks) and "slow" not in stream.episodes
    assert len(stream.turns) == waiting - 2  # what is left is the fast request's
    assert stream.inner.num_inflight + len(stream.queued) == len(stream.turns)
    stream.abort("slow")  # twice, or an id not in flight: ignored
    stream.add_request("slow", prompts[0], params, slow)
    while stream.num_inflight:
        done += stream.step()
    assert sorted(rid for rid, _ in done) == ["fast", "slow"]
    for c in dict(done)["slow"]:
        assert int((c.sampled == 0).sum()) == 5  # six turns, all of them played again


def test_config_check_names_a_bad_rollout_before_the_run_starts():
    from dapo_async.config import load_config
    from dapo_async.tools.config_check import _rollout_problems

    def problems(*overrides):
        return _rollout_problems(load_config("configs/tiny_calc.yaml", list(overrides)))

    assert problems() == []
    assert problems("generator.mode=batch", "generator.rollout=math:floor") == []
    (line,) = problems("generator.rollout=math:floor")  # a plain function in stream mode
    assert line.startswith("generator.rollout:") and "async def" in line
    (line,) = problems("generator.rollout=dapo_async.nope:fn")
    assert "cannot import" in line


def test_a_rollouts_own_reward_is_a_weighted_part_of_the_total():
    """Per-turn rewards, summed by the rollout into ``Trajectory.reward``, join the reward
    function's verdict as the part `rollout` (reward.rollout_weight); off by default."""
    from dapo_async.config import load_config
    from dapo_async.generator.scoring import ScoreItem, Scorer
    from dapo_async.reward.compose import RewardComposer

    class Pool:  # a hand-written verifier pool: every response is right
        def score_batch(self, items):
            return [{"score": 1.0, "acc": 1.0} for _ in items]

    ep = Episode([1])
    ep.add_turn(Turn(np.array([5]), np.array([-0.1], np.float32), np.zeros(1, np.int32), "stop"))
    c = ep.trajectory(reward=2.0).completion()
    items = [ScoreItem("t", "1", 3, "p", {}, c.rollout_reward), ScoreItem("t", "1", 3, "p", {})]
    cfg = load_config(None, ["reward.rollout_weight=0.5", "reward.overlong_shaping=false"])
    scorer = Scorer(RewardComposer(cfg.reward), Pool())
    assert scorer.component_names == ("correct", "overlong", "rollout")
    with_reward, without = scorer(items)
    assert with_reward.reward == 2.0 and with_reward.components == (1.0, 0.0, 2.0)
    assert without.reward == 1.0 and without.components[-1] == 0.0
    default = Scorer(
        RewardComposer(load_config(None, ["reward.overlong_shaping=false"]).reward), Pool()
    )
    assert default.component_names == ("correct", "overlong") and default(items)[0].reward == 1.0
    bad = Trajectory(np.array([5]), np.zeros(1, np.float32), np.zeros(1, np.int32), None, "stop",
                     "x", reward=float("nan"))  # fmt: skip
    with pytest.raises(RolloutError, match="reward is nan"):
        check_trajectory(bad, single_turn)
