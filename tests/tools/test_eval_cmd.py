"""`dapo-async eval`: avg@k / pass@k on held-out prompts of a built-in task and of a JSONL file
in the DAPO schema, checked against an independent count with the same model."""

import json

import pytest
import torch
from testutil import last_json, run_cli


def run_eval(repo, env, *args):
    out = run_cli(repo, env, "eval", *args, "--json", timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "[eval]" in out.stderr  # progress bar
    return last_json(out)


def test_eval_greedy_matches_an_independent_count(tiny_model, repo, cli_env):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dapo_async.data.tasks import generate
    from dapo_async.reward.verifiers import dapo_math

    res = run_eval(repo, cli_env, "--model", str(tiny_model), "--num-prompts", "16")
    assert res["k"] == 1 and res["num_prompts"] == 16 and res["temperature"] == 0.0
    assert res["avg_at_k"] == res["pass_at_k"]  # one greedy sample per prompt

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model)).eval()
    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    correct = 0
    for r in generate("chain", "eval", 16, 3, 0):
        ids = tok.apply_chat_template(
            r.messages, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        out = model.generate(
            input_ids=torch.tensor([ids]),
            do_sample=False,
            max_new_tokens=40,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
        )
        text = tok.decode(out[0, len(ids) :], skip_special_tokens=True)
        correct += dapo_math(text, r.ground_truth)["acc"]
    assert res["avg_at_k"] == correct / 16


def test_eval_k_samples_on_a_jsonl_file(tiny_model, tmp_path, repo, cli_env):
    rows = [
        {
            "data_source": "math_dapo",
            "prompt": [{"role": "user", "content": f"{a}+1="}],
            "ability": "MATH",
            "reward_model": {"ground_truth": str(a + 1), "style": "rule"},
            "extra_info": {"index": a},
        }
        for a in range(1, 7)
    ]
    f = tmp_path / "heldout.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in rows))
    res = run_eval(repo, cli_env, "--model", str(tiny_model), "--data", str(f), "--k", "3")
    assert res["k"] == 3 and res["num_prompts"] == 6 and res["temperature"] == 1.0
    assert 0.0 <= res["avg_at_k"] <= res["pass_at_k"] <= 1.0


@pytest.mark.slow
def test_eval_with_a_run_config_on_vllm_equals_transformers(tiny_model, repo, cli_env):
    """`eval --config` takes the run's data, reward and lengths; greedy decoding on the vLLM CPU
    engine and on transformers scores the same."""
    common = ["--config", "configs/tiny_cpu.yaml", "--model", str(tiny_model), "data.num_eval=16"]
    hf = run_eval(repo, cli_env, *common, "--engine", "hf")
    vllm = run_eval(repo, cli_env, *common, "--engine", "vllm")
    assert vllm["engine"] == "vllm" and vllm["num_prompts"] == hf["num_prompts"] == 16
    assert vllm["avg_at_k"] == hf["avg_at_k"]


def test_eval_reports_each_data_source(tiny_model, tmp_path, repo, cli_env):
    rows = [
        {
            "data_source": "easy" if a % 2 else "hard",
            "prompt": [{"role": "user", "content": f"{a}+1="}],
            "reward_model": {"ground_truth": str(a + 1)},
        }
        for a in range(1, 9)
    ]
    f = tmp_path / "mixed.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in rows))
    res = run_eval(repo, cli_env, "--model", str(tiny_model), "--data", str(f))
    assert set(res["per_source"]) == {"easy", "hard"}
    both = [res["per_source"][s]["avg_at_k"] for s in ("easy", "hard")]
    assert sum(both) / 2 == pytest.approx(res["avg_at_k"])


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["hf", "vllm"])
def test_eval_k8_reports_avg_and_pass_per_source(engine, tiny_model, tmp_path, repo, cli_env):
    """`eval --config C --k 8 --json`: avg@8 and pass@8 per data source. eval.engine is auto:
    the run's generator.engine picks the engine (vLLM's CPU build for `vllm`)."""
    rows = [
        {
            "data_source": "easy" if a % 2 else "hard",
            "prompt": [{"role": "user", "content": f"{a}+1="}],
            "reward_model": {"ground_truth": str(a + 1)},
        }
        for a in range(1, 5)
    ]
    f = tmp_path / "two_sources.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in rows))
    res = run_eval(
        repo, cli_env, "--config", "configs/tiny_cpu.yaml", "--model", str(tiny_model),
        "--k", "8", f"data.eval_source={f}", "data.prompt_format=raw",
        f"generator.engine={engine}", "eval.max_tokens=12",
    )  # fmt: skip
    assert res["engine"] == engine and res["k"] == 8 and res["temperature"] == 1.0
    assert set(res["per_source"]) == {"easy", "hard"}
    for part in res["per_source"].values():
        assert 0.0 <= part["avg_at_k"] <= part["pass_at_k"] <= 1.0
    avg = sum(p["avg_at_k"] for p in res["per_source"].values()) / 2
    assert avg == pytest.approx(res["avg_at_k"])
