"""The real-model path on a real-shaped model (tests/real_shaped.py: Qwen2 architecture, byte-level
BPE, Qwen chat template with a default system prompt, EOS ≠ padding): prompt rendering with
multi-byte text, then the main job end to end — generator (transformers, and vLLM's CPU build),
learner computing in bf16 over fp32 master weights, weight sync, held-out evaluation."""

import json

import pytest
from real_shaped import MULTIBYTE, write_jsonl
from testutil import TRAIN_FAST, last_json, max_generator_version, run_cli
from transformers import AutoTokenizer

from dapo_async.config import load_config
from dapo_async.data.prompts import PromptRenderer, encode_in_child


def test_prompts_with_multibyte_text_and_special_tokens(real_shaped_model, tmp_path):
    tok = AutoTokenizer.from_pretrained(str(real_shaped_model))
    assert tok.eos_token == "<|im_end|>" and tok.pad_token_id != tok.eos_token_id
    data = load_config(None, []).data
    msgs = [{"role": "user", "content": f"3+4= {MULTIBYTE}"}]
    renderer = PromptRenderer.from_config(tok, data)
    text = renderer.render(msgs)
    assert text.startswith("<|im_start|>system\nYou are a helpful assistant.<|im_end|>")
    ids = renderer.encode(msgs)
    assert tok.decode(ids) == text  # multi-byte characters survive the byte-level round trip
    assert ids.count(tok.convert_tokens_to_ids("<|im_start|>")) == 3  # special tokens, not text
    assert encode_in_child(str(real_shaped_model), data, [msgs], tmp_path) == [ids]  # buffer


def _train(model, tmp_path, cli_env, repo, *extra):
    data = write_jsonl(tmp_path / "data.jsonl")
    run = tmp_path / "run"
    out = run_cli(
        repo, cli_env, "train", "configs/tiny_cpu.yaml", f"model.path={model}", f"run_dir={run}",
        f"data.source={data}", f"data.eval_source={data}", "data.max_prompt_len=96",
        "generator.max_tokens=24", "learner.num_steps=3", *TRAIN_FAST,
        "learner.compute_dtype=bfloat16", *extra, "--json",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    summary = last_json(out)
    assert summary["steps"] == 3
    assert summary["heldout_accuracy_before"] is not None
    assert max_generator_version(run) >= 1  # new weights reached the generator
    after = json.loads((run / "eval_after.json").read_text())
    assert after["eval/num_rows"] == 64  # the file's rows (repeated prompts are folded)
    return run


def test_main_job_on_a_real_shaped_model_with_transformers(
    real_shaped_model, tmp_path, cli_env, repo
):
    _train(real_shaped_model, tmp_path, cli_env, repo, "generator.engine=hf")


@pytest.mark.slow
def test_main_job_on_a_real_shaped_model_with_vllm(real_shaped_model, tmp_path, cli_env, repo):
    _train(real_shaped_model, tmp_path, cli_env, repo, "generator.engine=vllm")
