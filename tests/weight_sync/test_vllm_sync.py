"""The learner side publishing 5 versions of the tiny policy to 2 generator processes — one
plain receiver, one vLLM CPU engine: both get bit-equal weights every time, and the vLLM
engine's greedy outputs equal transformers' with the same weights."""

import json
import multiprocessing as mp
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import xxhash
from testutil import greedy_tokens

from dapo_async.config import load_config

HERE = Path(__file__).resolve().parent
SPAWN = mp.get_context("spawn")
NUM_VERSIONS = 5


def version_state(model, v: int) -> dict:
    """The policy at version v: the tiny model nudged by a seeded perturbation."""
    g = torch.Generator().manual_seed(v)
    out = {}
    with torch.no_grad():
        for name, p in model.named_parameters():
            out[name] = (p + 0.02 * v * torch.randn(p.shape, generator=g)).contiguous()
    if "lm_head.weight" not in out:  # tied: the head is the embedding
        out["lm_head.weight"] = out["model.embed_tokens.weight"]
    return out


def _digests(state):
    return {k: xxhash.xxh3_64_intdigest(v.contiguous().numpy().tobytes()) for k, v in state.items()}


def _plain_receiver(endpoint, out):
    torch.set_num_threads(1)
    from dapo_async.weight_sync.dist_receiver import DistWeightReceiver

    r = DistWeightReceiver(
        load_config(None, ["weight_sync.timeout_s=60"]).weight_sync,
        None,
        "plain",
        endpoint=endpoint,
    )
    seen = 0
    deadline = time.time() + 600
    while seen < NUM_VERSIONS and time.time() < deadline:
        got = r.poll()
        if got is not None:
            out.put((got[1], _digests(got[0])))
            seen += 1
        time.sleep(0.02)
    r.close()


@pytest.mark.slow
def test_five_versions_reach_a_plain_and_a_vllm_generator(tiny_model, tmp_path, cli_env):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dapo_async.data.tasks import generate
    from dapo_async.weight_sync.dist import DistWeightPublisher

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model)).eval()
    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    prompts = [
        tok.apply_chat_template(
            r.messages, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        for r in generate("chain", "eval", 4, 3, 0)
    ]
    pub = DistWeightPublisher(
        load_config(None, ["weight_sync.timeout_s=60", "weight_sync.bucket_mb=1"]).weight_sync,
        None,
        host="127.0.0.1",
    )
    q = SPAWN.Queue()
    plain = SPAWN.Process(target=_plain_receiver, args=(pub.endpoint, q))
    plain.start()
    out_file = tmp_path / "vllm.jsonl"
    vllm = subprocess.Popen(
        [
            sys.executable,
            str(HERE / "vllm_receiver.py"),
            pub.endpoint,
            str(tiny_model),
            json.dumps(prompts),
            str(NUM_VERSIONS),
            str(out_file),
        ],
        env={**cli_env, "HF_HUB_OFFLINE": "1"},
        stdout=open(tmp_path / "vllm.log", "wb"),
        stderr=subprocess.STDOUT,
    )
    states = {v: version_state(model, v) for v in range(1, NUM_VERSIONS + 1)}
    try:
        deadline = time.monotonic() + 300
        while int(pub.store.get("joins")) < 2:
            assert vllm.poll() is None, (tmp_path / "vllm.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "receivers did not register"
            time.sleep(0.2)
        for v in range(1, NUM_VERSIONS + 1):
            pub.publish(states[v], v)
            assert pub.wait_sent(v, 120), f"version {v} not delivered"
        plain_got = [q.get(timeout=120) for _ in range(NUM_VERSIONS)]
        assert vllm.wait(timeout=300) == 0, (tmp_path / "vllm.log").read_text()[-3000:]
        plain.join(30)
    finally:
        for p in (plain,):
            if p.is_alive():
                p.kill()
        if vllm.poll() is None:
            vllm.kill()
        pub.close()
    lines = [json.loads(x) for x in out_file.read_text().splitlines()]
    assert [v for v, _ in plain_got] == list(range(1, NUM_VERSIONS + 1))
    assert [x["version"] for x in lines] == list(range(1, NUM_VERSIONS + 1))
    eos = tok.eos_token_id
    for (v, plain_digests), line in zip(plain_got, lines):
        want = _digests(states[v])
        assert plain_digests == want, f"plain receiver: v{v} not bit-equal"
        assert line["digests"] == want, f"vLLM receiver: v{v} not bit-equal"
        model.load_state_dict(states[v], strict=False)
        assert line["greedy"] == [greedy_tokens(model, p, eos) for p in prompts], (
            f"v{v} greedy differs"
        )
