"""Shared pytest setup: one torch thread per test process (two cores, several processes)."""

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture
def repo() -> Path:
    return REPO


@pytest.fixture
def cli_env() -> dict:
    """Environment for running `python -m dapo_async.cli` in a subprocess."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"
    return env


@pytest.fixture
def python() -> str:
    return sys.executable


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """The built-in tiny model with a short warm start (pipeline tests need a real HF
    directory, not a trained policy)."""
    from dapo_async.tiny.build import build

    d = tmp_path_factory.mktemp("tiny") / "model"
    build(d, seed=0, task="chain", sft_steps=20, log=lambda s: None)
    return d


@pytest.fixture
def greedy_hf_and_vllm(cli_env):
    """A function: model dir -> (transformers greedy texts, vLLM CPU greedy texts) on 8 held-out
    chain prompts; vLLM runs in its own process (tests/tiny/vllm_greedy.py)."""
    import json

    def run(model_dir):
        from dapo_async.data.tasks import generate
        from dapo_async.engines.base import SamplingParams
        from dapo_async.engines.hf import HFEngine

        records = generate("chain", "eval", 8, 3, 0)
        eng = HFEngine(str(model_dir))
        prompts = [
            eng.tokenizer.apply_chat_template(
                r.messages, add_generation_prompt=True, tokenize=False
            )
            for r in records
        ]
        ids = [eng.tokenizer(p, add_special_tokens=False).input_ids for p in prompts]
        params = SamplingParams(n=1, temperature=0.0, max_tokens=40)
        hf = [o[0].text for o in eng.generate(ids, params)]
        from testutil import run_vllm_script

        script = REPO / "tests" / "tiny" / "vllm_greedy.py"
        return hf, run_vllm_script(script, cli_env, model_dir, json.dumps(prompts))

    return run


def pytest_collection_modifyitems(config, items):
    """`gpu` tests run only where torch sees an NVIDIA GPU (tools/gpu_check.sh)."""
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except Exception:
        has_gpu = False
    if has_gpu:
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def reward_model_dir(tmp_path_factory):
    """A small random HF sequence-classification reward model with the tiny tokenizer."""
    import torch
    from transformers import LlamaConfig, LlamaForSequenceClassification

    from dapo_async.tiny.tokenizer import VOCAB_SIZE, build_tokenizer

    d = tmp_path_factory.mktemp("rm")
    tok = build_tokenizer(d)
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        num_labels=1,
        pad_token_id=tok.pad_token_id,
    )
    LlamaForSequenceClassification(cfg).save_pretrained(d)
    return d


@pytest.fixture(scope="session")
def real_shaped_model(tmp_path_factory) -> Path:
    """A Qwen2-architecture model with a byte-level BPE tokenizer (tests/real_shaped.py)."""
    from real_shaped import build_qwen2_like

    return build_qwen2_like(tmp_path_factory.mktemp("qwen2") / "model")
