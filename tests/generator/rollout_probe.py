"""Run in its own process (vLLM spawns an engine core): three-turn episodes played by the
rollout runner on one engine; one JSON line on stdout (``RESULT {...}``).

    python rollout_probe.py hf|vllm MODEL_DIR PROMPTS_JSON batch|stream

batch: ``EpisodeRunner`` on ``engine.generate``; stream: ``EpisodeStream`` on ``engine.stream``.
"""

import json
import os
import sys

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

# What the environment says between turns (a fixed text: its tokens are not sampled).
ENV_TEXT = "|ok|"
TURNS, TOKENS_PER_TURN = 3, 5


async def three_turns(ctx, sample):
    """Three sampled turns of at most TOKENS_PER_TURN tokens, the environment's text between."""
    from dapo_async.rollouts import Episode

    ep = Episode(sample.prompt_tokens)
    for k in range(TURNS):
        ep.add_turn(await ctx.generate(ep.tokens, max_tokens=TOKENS_PER_TURN))
        if k < TURNS - 1:
            ep.add_env(ctx.encode(ENV_TEXT))
    return ep.trajectory(info={"turns": float(TURNS)})


def dump(comps):
    return [
        {"tokens": c.tokens.tolist(), "logprobs": c.logprobs.tolist(),
         "versions": c.versions.tolist(), "sampled": c.sampled.tolist(), "finish": c.finish}
        for c in comps
    ]  # fmt: skip


def play(eng, prompts, g=2, seed=1):
    from dapo_async.engines.base import SamplingParams
    from dapo_async.rollouts import EpisodeRunner, Sample

    params = SamplingParams(temperature=1.0, max_tokens=30, seed=seed)
    runner = EpisodeRunner(three_turns, eng, params)
    trajs = runner.run([Sample(p, index=i) for p in prompts for i in range(g)])
    return runner.engine_calls, dump([t.completion() for t in trajs])


def play_stream(eng, prompts, g=2, seed=1):
    """The same episodes as requests of the engine's continuous-batching decoder."""
    from dapo_async.engines.base import SamplingParams
    from dapo_async.generator.episode_stream import EpisodeStream

    stream = EpisodeStream(eng.stream(4, reset_kv=False, seed=seed), three_turns, eng)
    params = SamplingParams(n=g, temperature=1.0, max_tokens=30, seed=seed)
    for i, p in enumerate(prompts):
        stream.add_request(str(i), p, params)
    done, steps = {}, 0
    while stream.num_inflight:
        done.update(stream.step())
        steps += 1
    return steps, dump([c for i in range(len(prompts)) for c in done[str(i)]])


if __name__ == "__main__":
    from dapo_async.config import load_config
    from dapo_async.generator.build import engine_for

    kind, model_dir, prompts_json, mode = sys.argv[1:5]
    prompts = json.loads(prompts_json)
    cfg = load_config(None, [f"generator.engine={kind}", "generator.dtype=float32",
                             "generator.max_model_len=128", f"generator.mode={mode}"])  # fmt: skip
    eng = engine_for(cfg, model_dir)
    calls, episodes = (play if mode == "batch" else play_stream)(eng, prompts)
    eng.close()
    print("RESULT " + json.dumps({"engine_calls": calls, "episodes": episodes}), flush=True)
