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
def test_loads_in_vllm_cpu_and_matches_transformers_greedy(tiny_model, greedy_hf_and_vllm):
    hf, vllm_texts = greedy_hf_and_vllm(tiny_model)
    assert vllm_texts == hf
