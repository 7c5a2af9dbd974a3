"""`dapo-async config check`: every shipped config against a model directory of its
architecture written here (the real config.json numbers, a Qwen-style tokenizer with a chat
template) and data files of the DAPO-Math schema: each passes; the Qwen2.5-Math-7B config with the
paper's 20k-token responses fails naming max_position_embeddings; bad models, data and
tokenizers are each one line."""

import json
import shutil
from pathlib import Path

import pytest
from real_shaped import build_qwen2_like, write_jsonl

from dapo_async.cli import main
from dapo_async.config import load_config
from dapo_async.tools.config_check import context_length, problems

# config.json fields of the models the shipped configs name (Hugging Face model cards)
ARCHITECTURES = {
    "qwen2.5_math_7b_dapo.yaml": dict(
        hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
        num_attention_heads=28, num_key_value_heads=4, max_position_embeddings=4096,
        vocab_size=152064, tie_word_embeddings=False, rope_theta=10000.0,
    ),
    "qwen2.5_32b_dapo.yaml": dict(
        hidden_size=5120, intermediate_size=27648, num_hidden_layers=64,
        num_attention_heads=40, num_key_value_heads=8, max_position_embeddings=131072,
        vocab_size=152064, tie_word_embeddings=False, rope_theta=1000000.0,
    ),
}  # fmt: skip


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    return build_qwen2_like(tmp_path_factory.mktemp("qwen") / "m")


def _model(tmp_path: Path, tokenizer_dir: Path, arch: dict) -> Path:
    d = tmp_path / "model"
    shutil.copytree(tokenizer_dir, d)
    small = json.loads((d / "config.json").read_text())  # the test model's: ids of its tokens
    ids = {k: small[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in small}
    cfg = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", **ids, **arch}
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def _paths(tmp_path, model) -> list[str]:
    data = write_jsonl(tmp_path / "train.jsonl")
    return [f"model.path={model}", f"data.source={data}", f"data.eval_source={data}"]


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_every_shipped_real_config_fits_its_model(repo, tmp_path, tokenizer_dir, name):
    model = _model(tmp_path, tokenizer_dir, ARCHITECTURES[name])
    cfg = load_config(repo / "configs" / name, _paths(tmp_path, model))
    assert problems(cfg) == []


def test_the_math_7b_config_with_the_papers_lengths_names_the_context(
    repo, tmp_path, tokenizer_dir, capsys
):
    model = _model(tmp_path, tokenizer_dir, ARCHITECTURES["qwen2.5_math_7b_dapo.yaml"])
    paper = ["data.max_prompt_len=2048", "generator.max_tokens=20480"]
    paper += ["generator.max_model_len=22528", "reward.overlong_cache_len=4096"]
    argv = ["config", "check", str(repo / "configs" / "qwen2.5_math_7b_dapo.yaml")]
    assert main([*argv, *_paths(tmp_path, model), *paper]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2, err
    assert "2048 + 20480 = 22528 exceed the model's context of 4096" in err[0]
    assert "max_position_embeddings 4096" in err[0] and err[1].startswith(
        "dapo-async config check: generator.max_model_len: 22528"
    )


def test_the_tiny_configs_pass(repo, tiny_model):
    for name in ("tiny_cpu.yaml", "tiny_grpo_naive.yaml", "tiny_long.yaml", "tiny_longtail.yaml"):
        assert problems(load_config(repo / "configs" / name, [f"model.path={tiny_model}"])) == []


def test_each_problem_is_one_line(repo, tmp_path, tokenizer_dir):
    model = _model(tmp_path, tokenizer_dir, ARCHITECTURES["qwen2.5_32b_dapo.yaml"])
    bad_rows = tmp_path / "bad.jsonl"
    bad_rows.write_text(json.dumps({"prompt": "hi"}) + "\n")  # no reward_model.ground_truth
    small = tmp_path / "small"
    shutil.copytree(model, small)
    cfg_json = json.loads((small / "config.json").read_text())
    (small / "config.json").write_text(json.dumps({**cfg_json, "vocab_size": 100}))
    config = repo / "configs" / "qwen2.5_32b_dapo.yaml"
    got = problems(load_config(config, [f"model.path={small}", f"data.source={bad_rows}"]))
    assert any(p.startswith("model.path: the tokenizer has") for p in got), got
    assert any(p.startswith("data.source:") and "ground_truth" in p for p in got), got
    assert any(p.startswith("data.eval_source:") and "not found" in p for p in got), got
    assert problems(load_config(config, ["model.path=/nope"]))[0] == (
        "model.path: /nope does not exist"
    )


def test_rope_scaling_extends_the_context():
    assert context_length({"max_position_embeddings": 4096})[0] == 4096
    yarn = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
    ctx, how = context_length({"max_position_embeddings": 32768, "rope_scaling": yarn})
    assert ctx == 131072 and "yarn" in how
