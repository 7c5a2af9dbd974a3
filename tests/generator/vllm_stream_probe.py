"""Run in its own process: the vLLM CPU engine's streaming decoder with a weight update in the
middle of the responses; one JSON line on stdout (``RESULT {...}``).

    python vllm_stream_probe.py MODEL_DIR NEW_WEIGHTS.safetensors PROMPTS_JSON RESET_KV
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

    model_dir, new_weights, prompts_json, reset_kv = sys.argv[1:5]
    prompts = json.loads(prompts_json)
    cfg = load_config(None, ["generator.max_model_len=128", "generator.mode=stream"])
    eng = VLLMEngine(model_dir, cfg)
    stream = eng.stream(4, reset_kv=reset_kv == "1")
    params = SamplingParams(n=2, temperature=1.0, max_tokens=30, seed=3)
    for i, p in enumerate(prompts):
        stream.add_request(str(i), p, params)
    done = dict(stream.step())  # 4 tokens each with the weights of v0
    eng.update_weights(load_file(new_weights), 1)
    while stream.num_inflight:
        done.update(stream.step())
    out = [
        [
            {"tokens": c.tokens.tolist(), "logprobs": c.logprobs.tolist(),
             "versions": c.versions.tolist()}
            for c in done[str(i)]
        ]
        for i in range(len(prompts))
    ]  # fmt: skip
    eng.close()
    print("RESULT " + json.dumps(out), flush=True)
