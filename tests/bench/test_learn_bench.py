"""`dapo-async bench learn`: aggregation of per-run gains, and fail-fast on bad input."""

import json

import pytest
from testutil import run_cli

from dapo_async.bench.learn_bench import aggregate, read_result


def test_aggregate_takes_the_worst_gain_and_the_means(tmp_path):
    for name, before, after in (("a", 0.2, 0.9), ("b", 0.3, 0.7)):
        d = tmp_path / name
        d.mkdir()
        (d / "eval_before.json").write_text(json.dumps({"eval/accuracy": before}))
        (d / "eval_after.json").write_text(json.dumps({"eval/accuracy": after}))
    runs = [read_result(tmp_path / "a"), read_result(tmp_path / "b")]
    agg = aggregate(runs)
    assert agg["gain_min"] == pytest.approx(0.4)
    assert agg["gain_mean"] == pytest.approx(0.55)
    assert agg["before_mean"] == pytest.approx(0.25)
    assert agg["after_mean"] == pytest.approx(0.8)
    with pytest.raises(ValueError):
        aggregate([])


def test_bad_override_or_seeds_fail_before_any_build(tmp_path, repo, cli_env):
    out = run_cli(repo, cli_env, "bench", "learn", "algo.clip_hihg=0.3", "--out", tmp_path)
    assert out.returncode == 1 and "clip_hihg" in out.stderr
    out = run_cli(repo, cli_env, "bench", "learn", "--init-seeds", "0,0", "--out", tmp_path)
    assert out.returncode != 0 and "--init-seeds" in out.stderr
    assert not any(tmp_path.iterdir())
