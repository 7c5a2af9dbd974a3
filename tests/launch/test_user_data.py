"""The main job on a user's own JSONL file (DAPO-Math schema) with a four-argument custom reward
``(prompt, response, ground_truth, extra_info)``: generators score through it during training and
the learner's held-out evaluation through it too."""

import json
import sys
from pathlib import Path

import pytest
from testutil import TRAIN_FAST, last_json, run_cli

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "reward"))
from test_custom_forms import write_user_jsonl  # noqa: E402


@pytest.mark.parametrize("form", ["two_float", "two_dict", "four_float", "four_dict"])
def test_main_job_trains_and_evaluates_with_each_custom_reward_form(
    form, tiny_model, tmp_path, cli_env
):
    data = tmp_path / "user.jsonl"
    write_user_jsonl(data, 64)
    env = dict(cli_env, PYTHONPATH=f"{REPO}:{REPO / 'tests' / 'reward'}")
    run = tmp_path / "run"
    out = run_cli(
        REPO, env, "train", "configs/tiny_cpu.yaml", f"model.path={tiny_model}",
        f"run_dir={run}", "learner.num_steps=3", *TRAIN_FAST, f"data.source={data}",
        f"data.eval_source={data}", f"reward.fn=custom_rewards:{form}", "--json",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    summary = last_json(out)
    assert summary["steps"] == 3
    before = json.loads((run / "eval_before.json").read_text())
    assert before["eval/num_rows"] == 64 and before["eval/accuracy"] > 0
    # the generators scored through the same function: the two-argument forms see the ground
    # truth they check (right every time), the four-argument ones vary with length
    acc = [
        json.loads(line).get("rollout/trained_accuracy")
        for line in (run / "metrics" / "learner.jsonl").read_text().splitlines()
    ]
    acc = [a for a in acc if a is not None]
    if form.startswith("two"):
        assert acc and all(a == 1.0 for a in acc)
    else:
        assert any(0 < a < 1 for a in acc)


def test_main_job_on_a_weighted_mixture_of_a_file_and_a_built_in_task(
    tiny_model, tmp_path, cli_env
):
    data = tmp_path / "user.jsonl"
    write_user_jsonl(data, 64)
    run = tmp_path / "run"
    out = run_cli(
        REPO, cli_env, "train", "configs/tiny_cpu.yaml", f"model.path={tiny_model}",
        f"run_dir={run}", "learner.num_steps=2", *TRAIN_FAST,
        f"data.sources={{{data}: 1, tiny:chain: 3}}", "--json",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert last_json(out)["steps"] == 2
    # both sources' prompts were loaded: the 64 of the file and the task's 4096
    assert "4160 prompts" in (run / "logs" / "buffer.log").read_text()
