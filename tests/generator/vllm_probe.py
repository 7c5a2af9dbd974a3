"""Run in its own process (vLLM spawns an engine core): one vLLM CPU engine, several probes,
one JSON line on stdout (``RESULT {...}``).

    python vllm_probe.py MODEL_DIR NEW_WEIGHTS.safetensors PROMPTS_JSON

Probes: sampled responses with their log-probs (temperature 1.0 and 0.8, processed mode), greedy
outputs, greedy outputs after loading NEW_WEIGHTS, and after loading the original weights back.
"""

import json
import os
import sys

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

if __name__ == "__main__":
    from safetensors.torch import load_file

    from dapo_async.config import load_config
    from dapo_async.engines.base import SamplingParams
    from dapo_async.engines.vllm import VLLMEngine

    model_dir, new_weights, prompts_json = sys.argv[1:4]
    prompts = json.loads(prompts_json)
    cfg = load_config(None, ["generator.max_model_len=128"])
    eng = VLLMEngine(model_dir, cfg)

    def dump(comps):
        return [
            [
                {"tokens": c.tokens.tolist(), "logprobs": c.logprobs.tolist(), "finish": c.finish}
                for c in per_prompt
            ]
            for per_prompt in comps
        ]

    greedy = SamplingParams(n=1, temperature=0.0, max_tokens=30)
    out = {
        "sampled_t1": dump(
            eng.generate(prompts, SamplingParams(n=2, temperature=1.0, max_tokens=30, seed=1))
        ),
        "sampled_t08": dump(
            eng.generate(prompts, SamplingParams(n=2, temperature=0.8, max_tokens=30, seed=2))
        ),
        "greedy_before": dump(eng.generate(prompts, greedy)),
    }
    sum_before = eng.param_checksum()
    eng.update_weights(load_file(new_weights), version=1)
    out["greedy_new"] = dump(eng.generate(prompts, greedy))
    out["sum_changed"] = eng.param_checksum() != sum_before
    eng.load_file(os.path.join(model_dir, "model.safetensors"), version=2)
    out["greedy_restored"] = dump(eng.generate(prompts, greedy))
    out["version"] = eng.version
    eng.close()
    print("RESULT " + json.dumps(out), flush=True)
