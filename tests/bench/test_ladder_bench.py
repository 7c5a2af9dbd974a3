"""`dapo-async bench ladder`: the arms of both ladders, the per-arm summary, fail-fast."""

import itertools
import json

import pytest
from testutil import run_cli

from dapo_async.bench.ladder_bench import (
    NAIVE_GRPO,
    async_arms,
    paper_arms,
    read_curve,
    summarize_arm,
)
from dapo_async.config import load_config


def test_paper_ladder_is_cumulative_from_naive_grpo_to_the_dapo_config():
    arms = paper_arms()
    names = list(arms)
    assert names[0] == "grpo" and names[-1] == "+dynamic_sampling" and len(names) == 6
    assert arms["grpo"] == NAIVE_GRPO
    for prev, cur in itertools.pairwise(names):
        assert arms[cur][: len(arms[prev])] == arms[prev]  # each rung keeps the ones before
    naive = load_config("configs/tiny_long.yaml", arms["grpo"])
    assert naive.algo.objective == "grpo" and not naive.buffer.dynamic_sampling
    assert not naive.reward.overlong_shaping and not naive.algo.overlong_filter
    # the top rung is the DAPO config itself
    top = load_config("configs/tiny_long.yaml", arms["+dynamic_sampling"])
    dapo = load_config("configs/tiny_long.yaml", [])
    for section in ("algo", "reward", "buffer"):
        assert getattr(top, section) == getattr(dapo, section), section


def test_async_ladder_crosses_staleness_with_the_objective_at_one_budget():
    arms = async_arms(45.0)
    assert len(arms) == 8
    cfg = load_config("configs/tiny_long.yaml", arms["naive-stale4"])
    assert cfg.buffer.max_staleness == 4 and cfg.algo.bypass
    assert cfg.learner.time_budget_s == 45.0
    cfg = load_config("configs/tiny_long.yaml", arms["decoupled-stale0"])
    assert cfg.buffer.max_staleness == 0 and not cfg.algo.bypass


def test_summary_counts_time_to_target_and_misses():
    runs = [
        {
            "seconds": [0, 10, 20],
            "accuracy": [0.1, 0.7, 0.8],
            "after": 0.8,
            "num_steps": 10,
            "train_seconds": 25.0,
        },
        {
            "seconds": [0, 10, 20],
            "accuracy": [0.1, 0.3, 0.5],
            "after": 0.5,
            "num_steps": 12,
            "train_seconds": 30.0,
        },
    ]
    s = summarize_arm(runs, target=0.6)
    assert s["after_mean"] == pytest.approx(0.65)
    assert s["after_std"] == pytest.approx(0.2121, abs=1e-3)
    assert s["seconds_to_target"] == pytest.approx((10 + 30) / 2)  # a miss counts its whole run
    assert s["missed_target"] == 1 and s["steps_mean"] == 11


def test_read_curve_merges_the_evaluator_and_takes_training_seconds_per_step(tmp_path):
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    learner = [
        {"step": 0, "eval/accuracy": 0.2},
        *({"step": s, "learner/train_seconds": 2.0 * s} for s in range(1, 11)),
        {"step": 10, "eval/accuracy": 0.9},
    ]
    evaluator = [{"step": 5, "eval/accuracy": 0.7}, {"step": 10, "eval/accuracy": 0.85}]
    for role, recs in (("learner", learner), ("evaluator", evaluator)):
        (metrics / f"{role}.jsonl").write_text("\n".join(json.dumps(r) for r in recs))
    (tmp_path / "eval_after.json").write_text(json.dumps({"eval/accuracy": 0.9}))
    (tmp_path / "learner_summary.json").write_text(
        json.dumps({"steps": 10, "seconds": 25.0, "train_seconds": 21.0})
    )
    r = read_curve(tmp_path)
    assert r["steps"] == [0, 5, 10]
    assert r["accuracy"] == [0.2, 0.7, 0.9]  # the learner's own figure wins at step 10
    assert r["seconds"] == [0.0, 10.0, 20.0]
    assert summarize_arm([r], target=0.6)["seconds_to_target"] == 10.0


def test_bad_override_fails_before_training(tmp_path, repo, cli_env):
    out = run_cli(repo, cli_env, "bench", "ladder", "algo.clip_hihg=0.3", "--out", tmp_path)
    assert out.returncode == 1 and "clip_hihg" in out.stderr
    assert not any(tmp_path.iterdir())
