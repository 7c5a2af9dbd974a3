import json
import subprocess
import sys

import pytest
from testutil import last_json, run_cli


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
    meta = json.loads((tiny_model / "tiny_meta.json").read_text())
    # the reported figures are the ones recorded at build time, with the stopping figures
    assert res["eval_accuracy"] == meta["eval_accuracy"]
    assert res["eval_steps_ok"] == meta["eval_steps_ok"]
    assert meta["sft_steps_run"] == 20 and meta["criterion"]["step"] == 20
    assert meta["cpu_model"]
    assert "reusing" in out.stdout + out.stderr


def test_loads_in_transformers_offline(tiny_model):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model, local_files_only=True)
    tok = AutoTokenizer.from_pretrained(tiny_model, local_files_only=True)
    assert model.config.hidden_size // model.config.num_attention_heads >= 32
    text = tok.apply_chat_template(
        [{"role": "user", "content": "1+2="}], add_generation_prompt=True, tokenize=False
    )
    assert text == "<bos>1+2=\n"


@pytest.mark.slow
def test_loads_in_vllm_cpu_and_matches_transformers_greedy(tiny_model, greedy_hf_and_vllm):
    hf, vllm_texts = greedy_hf_and_vllm(tiny_model)
    assert vllm_texts == hf


def test_lr_schedule_warms_up_then_decays_to_its_floor():
    from dapo_async.tiny import build as B

    assert B.lr_factor(0, 1000) == pytest.approx(1 / B.SFT_WARMUP_STEPS)
    assert B.lr_factor(B.SFT_WARMUP_STEPS - 1, 1000) == pytest.approx(1.0)
    mid = B.lr_factor(550, 1000)
    assert B.SFT_MIN_LR_FRAC < mid < 1.0
    assert B.lr_factor(1000, 1000) == pytest.approx(B.SFT_MIN_LR_FRAC)


def test_warm_start_that_misses_its_criterion_names_the_figures(tmp_path, monkeypatch):
    """A cap reached before the criterion fails with the figures, and leaves no model behind."""
    from dapo_async.tiny import build as B

    monkeypatch.setattr(B, "SFT_MAX_STEPS", B.CHECK_EVERY)  # far too few steps to learn
    with pytest.raises(B.WarmStartError, match=r"steps right 0\.\d\d after 50 steps") as e:
        B.build(tmp_path / "m", seed=0, log=lambda s: None)
    assert "target 0.9" in str(e.value) and "--seed" in str(e.value)
    assert not (tmp_path / "m").exists()


@pytest.mark.slow
def test_fresh_tiny_policy_learns_from_its_warm_start(tmp_path, repo, cli_env):
    """The main job's promise, from nothing cached: the warm start stops at its criterion
    (every step right on >= 90% of held-out prompts, the answer mostly the shortcut), and a
    short DAPO run lifts held-out greedy accuracy far above run-to-run noise (about ±0.04)."""
    tiny = tmp_path / "tiny"
    run = tmp_path / "run"
    args = (f"model.tiny_dir={tiny}", "model.tiny_seed=2", f"run_dir={run}")
    out = run_cli(
        repo, cli_env, "train", "configs/tiny_cpu.yaml", *args, "learner.num_steps=20",
        "tracking.aim=false", "--json", timeout=900,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    meta = json.loads((tiny / "tiny_meta.json").read_text())
    assert meta["criterion"]["steps_ok"] >= 0.9 and meta["eval_steps_ok"] >= 0.8
    assert meta["eval_accuracy"] <= 0.4  # the shortcut keeps the start low
    summary = last_json(out)
    gain = summary["heldout_accuracy_after"] - summary["heldout_accuracy_before"]
    assert gain >= 0.3, summary
