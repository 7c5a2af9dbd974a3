import json
import subprocess
import sys

import pytest


def test_init_tiny_cli_reuses_and_reports(tiny_model, cli_env, repo):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "dapo_async.cli",
            "init-tiny",
            "--out",
            str(tiny_model),
            "--sft-steps",
            "20",
        ],
        capture_output=True,
        text=True,
        cwd=repo,
        env=cli_env,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert 0.5e6 <= res["num_params"] <= 3e6
    assert 0.0 <= res["eval_accuracy"] <= 1.0
    assert "reusing" in out.stdout + out.stderr


def test_loads_in_transformers_offline(tiny_model):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model, local_files_only=True)
    tok = AutoTokenizer.from_pretrained(tiny_model, local_files_only=True)
    assert model.config.head_dim if hasattr(model.config, "head_dim") else True
    assert model.config.hidden_size // model.config.num_attention_heads >= 32
    text = tok.apply_chat_template(
        [{"role": "user", "content": "1+2="}], add_generation_prompt=True, tokenize=False
    )
    assert text == "<bos>1+2=\n"


@pytest.mark.slow
def test_loads_in_vllm_cpu_and_matches_transformers_greedy(tiny_model, cli_env, repo):
    from dapo_async.data.tasks import generate
    from dapo_async.generator.engine import SamplingParams
    from dapo_async.generator.hf_engine import HFEngine

    records = generate("chain", "eval", 8, 3, 0)
    eng = HFEngine(str(tiny_model))
    prompts = [
        eng.tokenizer.apply_chat_template(r.messages, add_generation_prompt=True, tokenize=False)
        for r in records
    ]
    ids = [eng.tokenizer(p, add_special_tokens=False).input_ids for p in prompts]
    hf = [o[0].text for o in eng.generate(ids, SamplingParams(n=1, temperature=0.0, max_tokens=40))]
    env = {**cli_env, "HF_HUB_OFFLINE": "1"}
    out = subprocess.run(
        [
            sys.executable,
            str(repo / "tests" / "tiny" / "vllm_greedy.py"),
            str(tiny_model),
            json.dumps(prompts),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    line = next(x for x in out.stdout.splitlines() if x.startswith("RESULT "))
    vllm_texts = json.loads(line[len("RESULT ") :])
    assert vllm_texts == hf
