"""Run in its own process (vLLM spawns an engine core): three-turn episodes played by the
rollout runner on one engine; one JSON line on stdout (``RESULT {...}``).

    python rollout_probe.py hf|vllm MODEL_DIR PROMPTS_JSON
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
    from dapo_async.generator.rollouts import Episode

    ep = Episode(sample.prompt_tokens)
    for k in range(TURNS):
        ep.add_turn(await ctx.generate(ep.tokens, max_tokens=TOKENS_PER_TURN))
        if k < TURNS - 1:
            ep.add_env(ctx.encode(ENV_TEXT))
    return ep.trajectory(info={"turns": float(TURNS)})


def play(eng, prompts, g=2, seed=1):
    from dapo_async.engines.base import SamplingParams
    from dapo_async.generator.rollouts import EpisodeRunner, Sample

    runner = EpisodeRunner(
        three_turns, eng, SamplingParams(temperature=1.0, max_tokens=30, seed=seed)
    )
    trajs = runner.run([Sample(p, index=i) for p in prompts for i in range(g)])
    return runner.engine_calls, [
        {"tokens": t.tokens.tolist(), "logprobs": t.logprobs.tolist(),
         "versions": t.versions.tolist(), "sampled": t.sampled.tolist(), "finish": t.finish}
        for t in trajs
    ]  # fmt: skip


if __name__ == "__main__":
    from dapo_async.config import load_config
    from dapo_async.generator.build import engine_for

    kind, model_dir, prompts_json = sys.argv[1:4]
    prompts = json.loads(prompts_json)
    cfg = load_config(None, [f"generator.engine={kind}", "generator.dtype=float32",
                             "generator.max_model_len=128", "generator.mode=batch"])  # fmt: skip
    eng = engine_for(cfg, model_dir)
    calls, episodes = play(eng, prompts)
    eng.close()
    print("RESULT " + json.dumps({"engine_calls": calls, "episodes": episodes}), flush=True)
