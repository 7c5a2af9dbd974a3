"""Run in its own process (vLLM spawns an engine core): greedy outputs of vLLM's CPU build
for the prompts given as JSON on argv, printed as one JSON line."""

import json
import os
import sys

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

if __name__ == "__main__":
    from vllm import LLM, SamplingParams

    llm = LLM(model=sys.argv[1], enforce_eager=True, max_model_len=128, dtype="float32")
    prompts = json.loads(sys.argv[2])
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=40))
    print("RESULT " + json.dumps([o.outputs[0].text for o in outs]))
