"""Run in its own process (vLLM spawns an engine core): a generator-side vLLM CPU engine whose
worker joins the weight-sync group itself (the bucket broadcasts land in the engine's worker
process), applies every version it receives and records, per version, the digest of each
received tensor and the engine's greedy outputs for PROMPTS (one JSON line each).

    python vllm_receiver.py ENDPOINT MODEL_DIR PROMPTS_JSON NUM_VERSIONS OUT.jsonl
"""

import json
import os
import sys
import time

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

if __name__ == "__main__":
    from dapo_async.config import load_config
    from dapo_async.engines.base import SamplingParams
    from dapo_async.engines.vllm import VLLMEngine

    endpoint, model_dir, prompts_json, num_versions, out_path = sys.argv[1:6]
    prompts = json.loads(prompts_json)
    cfg = load_config(None, ["generator.max_model_len=128"])
    eng = VLLMEngine(model_dir, cfg)
    eng.connect_weight_sync(endpoint, "vllm-gen", 60.0, "gloo", digests=True)
    seen = 0
    deadline = time.time() + 600
    with open(out_path, "w") as out:
        while seen < int(num_versions) and time.time() < deadline:
            got = eng.poll_weight_sync()
            if got is None:
                time.sleep(0.02)
                continue
            comps = eng.generate(prompts, SamplingParams(n=1, temperature=0.0, max_tokens=30))
            line = {
                "version": eng.version,
                "digests": got["digests"],
                "greedy": [c[0].tokens.tolist() for c in comps],
            }
            out.write(json.dumps(line) + "\n")
            out.flush()
            seen += 1
    eng.close_weight_sync()
    eng.close()
