"""`dapo-async bench ablation`: both arms train per seed and the JSON line summarises exactly the
run directories it leaves behind."""

import json

import pytest
from testutil import last_json, run_cli

from dapo_async.bench.ablation_bench import read_run
from dapo_async.bench.common import parse_seeds

FAST = [
    "buffer.groups_per_step=4",
    "generator.prompts_per_batch=4",
    "data.num_eval=8",
    # the fixture model is barely warm-started (accuracy 0): dynamic sampling would drop every
    # group and the learner would wait forever
    "buffer.dynamic_sampling=false",
]


def _write_run(d, curve, before, after, produced=10, seconds=3.0):
    (d / "metrics").mkdir(parents=True)
    lines = [json.dumps({"step": 1, "rollout/accuracy": 0.5})]
    lines += [json.dumps({"step": s, "eval/accuracy": a}) for s, a in curve]
    lines.append("{not json")  # a torn last line of a killed run is skipped
    (d / "metrics" / "learner.jsonl").write_text("\n".join(lines))
    (d / "eval_before.json").write_text(json.dumps({"eval/accuracy": before}))
    (d / "eval_after.json").write_text(json.dumps({"eval/accuracy": after}))
    (d / "buffer_final.json").write_text(json.dumps({"counters": {"produced": produced}}))
    (d / "learner_summary.json").write_text(json.dumps({"seconds": seconds}))


def test_read_run_averages_the_curve_with_the_final_evaluation(tmp_path):
    _write_run(tmp_path / "a", [(5, 0.5), (10, 0.7)], before=0.25, after=0.9)
    r = read_run(tmp_path / "a")
    assert r["heldout_before"] == 0.25 and r["heldout_after"] == 0.9
    assert r["curve_mean"] == pytest.approx((0.5 + 0.7 + 0.9) / 3)
    assert r["groups_generated"] == 10 and r["train_seconds"] == 3.0
    # the final evaluation already in the curve is not counted twice
    _write_run(tmp_path / "b", [(5, 0.5), (10, 0.9)], before=0.25, after=0.9)
    assert read_run(tmp_path / "b")["curve_mean"] == pytest.approx(0.7)


def test_read_run_counts_the_evaluator_roles_periodic_evaluations(tmp_path):
    """With learner.eval_process (the default) the periodic evaluations are the evaluator's:
    a curve of the learner's records alone is just before and after."""
    _write_run(tmp_path / "a", [(0, 0.2)], before=0.2, after=0.9)
    evaluator = [{"step": 5, "eval/accuracy": 0.6}, {"step": 10, "eval/accuracy": 0.8}]
    lines = "\n".join(json.dumps(r) for r in evaluator)
    (tmp_path / "a" / "metrics" / "evaluator.jsonl").write_text(lines)
    assert read_run(tmp_path / "a")["curve_mean"] == pytest.approx((0.2 + 0.6 + 0.8 + 0.9) / 4)


def test_parse_seeds_rejects_bad_lists():
    assert parse_seeds("0,1,2") == [0, 1, 2]
    for bad in ("", "0,0", "a,1"):
        with pytest.raises(SystemExit, match="--seeds"):
            parse_seeds(bad)


def test_bad_override_fails_before_training(tmp_path, repo, cli_env):
    out = run_cli(repo, cli_env, "bench", "ablation", "algo.clip_hihg=0.3", "--out", tmp_path)
    assert out.returncode == 1
    assert "clip_hihg" in out.stderr
    assert not any(tmp_path.iterdir())


@pytest.mark.slow
def test_ablation_trains_every_arm_per_seed(tiny_model, tmp_path, repo, cli_env):
    """Both arms, two seeds, real trainings (the --sync and --stream arms are the same trainings
    with one override each: their overrides and figures are checked without training below)."""
    out = run_cli(
        repo, cli_env, "bench", "ablation", f"model.path={tiny_model}", *FAST,
        "--seeds", "0,1", "--steps", "2", "--eval-every", "1", "--out", tmp_path, "--json",
        timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    res = last_json(out)
    assert res["seeds"] == [0, 1] and res["steps"] == 2
    for arm in ("dapo", "grpo"):
        after = [
            json.loads((tmp_path / f"{arm}-seed{s}" / "eval_after.json").read_text())[
                "eval/accuracy"
            ]
            for s in (0, 1)
        ]
        assert res[f"{arm}_heldout_after"] == after
        assert res[f"{arm}_heldout_after_mean"] == pytest.approx(sum(after) / 2)
        assert res[f"{arm}_groups_generated_mean"] >= 2 * 4  # two steps of four groups
        cfg = (tmp_path / f"{arm}-seed1" / "config.yaml").read_text()
        assert "seed: 1" in cfg
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == [
        "dapo-seed0", "dapo-seed1", "grpo-seed0", "grpo-seed1",
    ]  # fmt: skip
    # each arm trained its own config
    dapo_cfg = (tmp_path / "dapo-seed0" / "config.yaml").read_text()
    grpo_cfg = (tmp_path / "grpo-seed0" / "config.yaml").read_text()
    assert "clip_high: 0.28" in dapo_cfg and "clip_high: 0.2\n" in grpo_cfg
    assert "loss_agg: token-mean" in dapo_cfg and "loss_agg: seq-mean-token-mean" in grpo_cfg
    assert res["margin"] == pytest.approx(
        res["dapo_heldout_after_mean"] - res["grpo_heldout_after_mean"]
    )
    wins = sum(d > g for d, g in zip(res["dapo_heldout_after"], res["grpo_heldout_after"]))
    assert res["dapo_wins"] == wins


def test_sync_and_stream_arms_train_dapo_with_one_override_and_report_their_gaps():
    import argparse

    from dapo_async.bench.ablation_bench import make_arms, summarize

    args = argparse.Namespace(
        config="c.yaml", baseline="b.yaml", sync=True, stream=True, components=False
    )
    arms = make_arms(args)
    assert arms == {
        "dapo": ("c.yaml", []),
        "grpo": ("b.yaml", []),
        "dapo_sync": ("c.yaml", ["buffer.max_staleness=0"]),
        "dapo_batch": ("c.yaml", ["generator.mode=batch"]),
        "dapo_stream": ("c.yaml", ["generator.mode=stream"]),
    }
    after = {"dapo": (0.8, 0.6), "grpo": (0.5, 0.7), "dapo_sync": (0.9, 0.9),
             "dapo_batch": (0.6, 0.8), "dapo_stream": (0.7, 0.9)}  # fmt: skip
    results = {
        name: [
            {
                "heldout_before": 0.2,
                "heldout_after": a,
                "curve_mean": a,
                "groups_generated": 8.0,
                "train_seconds": 1.0,
            }
            for a in accs
        ]
        for name, accs in after.items()
    }
    out = summarize(results, {n: n for n in arms}, [0, 1], 2, sync=True)
    assert out["async_gap"] == pytest.approx(0.7 - 0.9)
    assert out["stream_gap"] == pytest.approx(0.8 - 0.7)
    assert out["dapo_heldout_after_std"] == pytest.approx(0.1)  # the batch arm's seed spread
    assert out["dapo_wins"] == 1 and out["margin"] == pytest.approx(0.1)
