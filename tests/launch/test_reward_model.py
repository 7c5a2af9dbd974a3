"""The main job with a reward model: the launcher starts `reward-server` on the run's keys,
generators score prompt + response with it in one batched request per call, and the reward's
parts (verifier, overlong, model) are reported separately."""

import json
from pathlib import Path

import psutil
from testutil import TRAIN_FAST, last_json, run_cli

REPO = Path(__file__).resolve().parents[2]


def test_main_job_scores_with_a_reward_model_the_launcher_serves(
    tiny_model, reward_model_dir, tmp_path, cli_env
):
    run = tmp_path / "run"
    out = run_cli(
        REPO, cli_env, "train", "configs/tiny_cpu.yaml", f"model.path={tiny_model}",
        f"run_dir={run}", "learner.num_steps=3", *TRAIN_FAST,
        f"reward.model_path={reward_model_dir}", "reward.model_weight=0.5", "--json",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert last_json(out)["steps"] == 3
    assert (
        "reward-server listening on tcp://127.0.0.1:" in (run / "logs" / "reward.log").read_text()
    )
    rows = []
    for path in (run / "metrics").glob("gen*.jsonl"):
        rows += [json.loads(line) for line in path.read_text().splitlines()]
    model_means = [
        r["generator/reward_model_mean"] for r in rows if "generator/reward_model_mean" in r
    ]
    assert model_means and any(m != 0.0 for m in model_means)  # a random model scores nonzero
    assert all(r.get("generator/reward_model_failures", 0) == 0 for r in rows)
    assert all("generator/reward_correct_mean" in r for r in rows if "generator/reward_mean" in r)
    final = json.loads((run / "buffer_final.json").read_text())
    assert final["component_names"] == ["correct", "overlong", "model"]
    # the launcher stopped every role it started, the reward server included
    left = [
        p.info["cmdline"]
        for p in psutil.process_iter(["cmdline"])
        if any(str(run) in part for part in (p.info["cmdline"] or []))
    ]
    assert not left, left
