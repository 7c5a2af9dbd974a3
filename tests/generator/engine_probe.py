"""Run in its own process (vLLM spawns an engine core): one engine of the kind given, driven
through ``engines.base.Engine`` only; one JSON line on stdout (``RESULT {...}``).

    python engine_probe.py hf|vllm MODEL_DIR NEW_WEIGHTS.safetensors PROMPTS_JSON

Probes, in order (versions in brackets): attributes; sampled responses (t=1.0, 0.8) and greedy ones
[0]; greedy after update_weights(NEW) [1]; greedy after load_file(the original) [2]; then twice
(reset_kv on [2→3], off [4→5]): the original loaded, a stream decodes one chunk, NEW is given
mid-response, the stream finishes; last, a greedy stream [5] where one request is aborted
after a chunk (and an unknown id ignored), then added again under the same id.
"""

import json
import os
import sys

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


def dump(comps):
    return [
        [
            {"tokens": c.tokens.tolist(), "logprobs": c.logprobs.tolist(), "finish": c.finish,
             "versions": None if c.versions is None else c.versions.tolist()}
            for c in per_prompt
        ]
        for per_prompt in comps
    ]  # fmt: skip


def stream_across_update(eng, prompts, new_state, old_version, reset_kv):
    from dapo_async.engines.base import SamplingParams

    stream = eng.stream(4, reset_kv=reset_kv, seed=3)
    params = SamplingParams(n=2, temperature=1.0, max_tokens=30, seed=3)
    for i, p in enumerate(prompts):
        stream.add_request(str(i), p, params)
    done = dict(stream.step())  # 4 tokens each with the old weights
    eng.update_weights(new_state, old_version + 1)
    while stream.num_inflight:
        done.update(stream.step())
    return dump([done[str(i)] for i in range(len(prompts))])


def stream_with_abort(eng, prompts):
    from dapo_async.engines.base import SamplingParams

    stream = eng.stream(4)
    greedy = SamplingParams(n=1, temperature=0.0, max_tokens=30)  # (vLLM: greedy is n=1)
    for i, p in enumerate(prompts):
        stream.add_request(str(i), p, greedy)
    returned = list(stream.step())
    stream.abort("1")
    stream.abort("no-such-request")
    inflight_after_abort = stream.num_inflight
    returned += stream.step()
    stream.add_request("1", prompts[1], greedy)  # the same id again, from its prompt
    while stream.num_inflight:
        returned += stream.step()
    return {
        "inflight_after_abort": inflight_after_abort,
        "ids": [rid for rid, _ in returned],
        "tokens": {rid: [c.tokens.tolist() for c in comps] for rid, comps in returned},
    }


if __name__ == "__main__":
    from safetensors.torch import load_file

    from dapo_async.config import load_config
    from dapo_async.engines.base import SamplingParams
    from dapo_async.generator.build import engine_for

    kind, model_dir, new_weights, prompts_json = sys.argv[1:5]
    prompts = json.loads(prompts_json)
    # fp32 wherever it runs: the checks compare with a transformers forward pass at 1e-4
    overrides = [f"generator.engine={kind}", "generator.dtype=float32",
                 "generator.max_model_len=128", "generator.mode=stream"]  # fmt: skip
    cfg = load_config(None, overrides)
    eng = engine_for(cfg, model_dir)
    original = os.path.join(model_dir, "model.safetensors")
    new_state = load_file(new_weights)
    greedy = SamplingParams(n=1, temperature=0.0, max_tokens=30)
    out = {
        "attrs": {
            "version": eng.version,
            "eos_id": eng.eos_id,
            "device": str(eng.device),
            "decoded": eng.tokenizer.decode(prompts[0]),
        },
        "sampled": dump(
            eng.generate(prompts, SamplingParams(n=2, temperature=1.0, max_tokens=30, seed=1))
        ),
        "sampled_t08": dump(
            eng.generate(prompts, SamplingParams(n=2, temperature=0.8, max_tokens=30, seed=2))
        ),
        "greedy_before": dump(eng.generate(prompts, greedy)),
    }
    eng.update_weights(new_state, 1)
    out["greedy_new"] = dump(eng.generate(prompts, greedy))
    eng.load_file(original, 2)
    out["greedy_restored"] = dump(eng.generate(prompts, greedy))
    out["stream_reset"] = stream_across_update(eng, prompts[:4], new_state, 2, reset_kv=True)
    eng.load_file(original, 4)
    out["stream_kept"] = stream_across_update(eng, prompts[:4], new_state, 4, reset_kv=False)
    out["version"] = eng.version
    out["stream_abort"] = stream_with_abort(eng, prompts[:3])
    eng.close()
    print("RESULT " + json.dumps(out), flush=True)
