"""Run in its own process (vLLM spawns an engine core): a generator-side vLLM CPU engine that
joins the weight-sync group, applies every version it receives and records, per version, the
digest of each received tensor and its greedy outputs for PROMPTS (one JSON line each).

    python vllm_receiver.py ENDPOINT MODEL_DIR PROMPTS_JSON NUM_VERSIONS OUT.jsonl
"""

import json
import os
import sys
import time

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

if __name__ == "__main__":
    import xxhash

    from dapo_async.config import load_config
    from dapo_async.generator.engine import SamplingParams
    from dapo_async.generator.vllm_engine import VLLMEngine
    from dapo_async.weight_sync.dist import DistWeightReceiver

    endpoint, model_dir, prompts_json, num_versions, out_path = sys.argv[1:6]
    prompts = json.loads(prompts_json)
    cfg = load_config(None, ["generator.max_model_len=128", "weight_sync.timeout_s=60"])
    eng = VLLMEngine(model_dir, cfg)
    rec = DistWeightReceiver(cfg, None, "vllm-gen", endpoint=endpoint)
    seen = 0
    deadline = time.time() + 600
    with open(out_path, "w") as out:
        while seen < int(num_versions) and time.time() < deadline:
            got = rec.poll()
            if got is None:
                time.sleep(0.02)
                continue
            state, version = got
            digests = {
                k: xxhash.xxh3_64_intdigest(v.contiguous().numpy().tobytes())
                for k, v in state.items()
            }
            eng.update_weights(state, version)
            comps = eng.generate(prompts, SamplingParams(n=1, temperature=0.0, max_tokens=30))
            line = {
                "version": version,
                "digests": digests,
                "greedy": [c[0].tokens.tolist() for c in comps],
            }
            out.write(json.dumps(line) + "\n")
            out.flush()
            seen += 1
    rec.close()
    eng.close()
