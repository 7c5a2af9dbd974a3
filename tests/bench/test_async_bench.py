"""`dapo-async bench async`: steady-state figures come from the learner's own step records."""

import json
from pathlib import Path

import pytest
from testutil import run_cli

from dapo_async.bench.async_bench import collapse_warnings, median_of_rounds, steady_state
from dapo_async.tiny.build import cpu_model


def _write_steps(d, steps):
    """steps: (time, num_responses, wait_data_s, staleness) per learner step."""
    (d / "metrics").mkdir(parents=True)
    lines = [json.dumps({"step": 0, "eval/accuracy": 0.3, "time": 0.0})]
    for i, (t, n, wait, stale) in enumerate(steps, start=1):
        rec = {"step": i, "time": t, "rollout/num_responses": n, "time/wait_data_s": wait}
        lines.append(json.dumps({**rec, "staleness/mean": stale}))
    lines.append('{"step": 99, "ti')  # a line cut by a crash is skipped
    (d / "metrics" / "learner.jsonl").write_text("\n".join(lines))
    (d / "eval_after.json").write_text(json.dumps({"eval/accuracy": 0.9}))


def test_steady_state_skips_the_first_steps(tmp_path):
    # step 1 is start-up (slow, much waiting); steps 2-4 are the window, timed from step 1's end
    _write_steps(
        tmp_path,
        [(10.0, 64, 9.0, 0.0), (12.0, 64, 0.5, 1.0), (14.0, 64, 0.0, 2.0), (18.0, 128, 1.5, 2.0)],
    )
    r = steady_state(tmp_path, skip=1)
    assert r["steps"] == 4
    assert r["samples_per_s"] == pytest.approx((64 + 64 + 128) / (18.0 - 10.0))
    assert r["learner_idle"] == pytest.approx((0.5 + 0.0 + 1.5) / 8.0)
    assert r["staleness_mean"] == pytest.approx(5.0 / 3)
    assert r["heldout_after"] == 0.9 and "heldout_before" not in r


def test_steady_state_needs_two_steps_past_the_skip(tmp_path):
    _write_steps(tmp_path, [(1.0, 8, 0.0, 0.0), (2.0, 8, 0.0, 0.0)])
    with pytest.raises(RuntimeError, match="fewer than 3 learner steps"):
        steady_state(tmp_path, skip=1)


def test_rounds_give_medians_of_each_rounds_own_ratio():
    rounds = [
        {"steps": 24, "sync_samples_per_s": 100.0, "async_samples_per_s": 150.0, "speedup": 1.5,
         "heldout_before": None, "run_dirs": ["r1/sync", "r1/async"]},
        {"steps": 24, "sync_samples_per_s": 80.0, "async_samples_per_s": 200.0, "speedup": 2.5,
         "heldout_before": None, "run_dirs": ["r2/sync", "r2/async"]},
        {"steps": 24, "sync_samples_per_s": 120.0, "async_samples_per_s": 190.0, "speedup": 190 / 120,
         "heldout_before": None, "run_dirs": ["r3/sync", "r3/async"]},
    ]  # fmt: skip
    out = median_of_rounds(rounds)
    # the median round's own ratio, not the ratio of the medians (190 / 100)
    assert out["speedup"] == pytest.approx(190 / 120)
    assert out["sync_samples_per_s"] == 100.0 and out["async_samples_per_s"] == 190.0
    assert out["steps"] == 24 and out["heldout_before"] is None
    assert out["rounds"] == rounds and len(out["run_dirs"]) == 6
    assert out["range"]["speedup"] == [1.5, 2.5]  # the spread of the rounds' own ratios
    assert out["range"]["sync_samples_per_s"] == [80.0, 120.0]
    assert median_of_rounds(rounds[:1]) == rounds[0]


def test_a_collapsed_run_is_named_in_the_warnings_of_its_round_and_of_the_median():
    res = {"sync": {"collapsed_at": []}, "async": {"collapsed_at": [18, 19, 20]}}
    (warning,) = collapse_warnings(res)
    assert warning.startswith("async: the sampled accuracy collapsed at steps 18–20")
    assert collapse_warnings({"stream": {"collapsed_at": [7]}})[0].startswith("stream: ")
    rounds = [
        {"speedup": 2.0, "run_dirs": [], "warnings": []},
        {"speedup": 0.3, "run_dirs": [], "warnings": [warning]},
        {"speedup": 2.1, "run_dirs": [], "warnings": []},
    ]
    assert median_of_rounds(rounds)["warnings"] == [f"round 2: {warning}"]


def test_too_few_steps_for_the_staleness_fails_before_training(tmp_path, repo, cli_env):
    out = run_cli(
        repo, cli_env, "bench", "async", "--steps", "4", "--staleness", "2", "--out", tmp_path
    )
    assert out.returncode != 0
    assert "--steps must be at least 5" in out.stderr
    assert not any(tmp_path.iterdir())


@pytest.mark.slow
def test_longtail_workload_measures_three_modes_in_one_run(tiny_model, tmp_path, repo, cli_env):
    """Synchronous, asynchronous batch and asynchronous stream runs of the long-tail workload,
    each with its throughput, learner idle, engine occupancy and (async) length KS figures."""
    out = run_cli(
        repo, cli_env, "bench", "async", f"model.path={tiny_model}",
        "buffer.groups_per_step=4", "generator.prompts_per_batch=4", "data.num_eval=16",
        "buffer.dynamic_sampling=false", "launch.share_cores=true", "launch.spare_generators=0",
        # lend on any wait: whether the sync learner's idle crosses the default 0.5 depends on
        # the CPU (0.67 on one EPYC; a CI machine never lent) and this test checks the wiring
        "launch.lend_idle_above=0",
        "--workload", "longtail",
        "--steps", "4",
        "--staleness", "1", "--rounds", "1", "--decode-delay-ms", "1", "--out", tmp_path,
        "--json", timeout=900,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    for mode in ("sync", "batch", "stream"):
        assert r[f"samples_per_s_{mode}"] > 0
        assert 0 <= r[f"learner_idle_{mode}"] <= 1
        assert 0 <= r[f"learner_wait_floor_{mode}"] <= 1
        assert 0 < r[f"engine_occupancy_{mode}"] <= 1
    for mode in ("batch", "stream"):
        assert 0 <= r[f"ks_len_{mode}"] <= 1 and 0 <= r[f"ks_p_{mode}"] <= 1
    assert r["speedup_stream_vs_batch"] > 0
    assert r["machine"].startswith(cpu_model()) and " cores" in r["machine"]  # figures name it
    # every generated token is counted; dynamic sampling is off here, so none was dropped
    final = json.loads((tmp_path / "stream" / "buffer_final.json").read_text())["counters"]
    assert final["tokens_produced"] > 0 and r["filtered_token_share_stream"] == 0.0
    assert r["stale_share_stream"] == final["dropped"].get("stale", 0) / final["qualified"]
    assert 0 <= r["phase1_learner_idle_stream"] <= 1  # the window by parts
    assert r["phase1_produced_per_qualified_stream"] >= 1
    assert r["response_len"]["max"] > r["response_len"]["min"]
    gen = json.loads(next((tmp_path / "stream" / "generators").glob("*.json")).read_text())
    assert "update_pause_s" in gen  # the stream loop ran
    # the learner's core went to the generator while it waited (launch.share_cores)
    assert r["learner_lent_s_sync"] > 0 and r["generator_borrowed_s_sync"] > 0
    assert "cores/borrowed_s" in gen
    cfg = (tmp_path / "stream" / "config.yaml").read_text()
    assert "decode_delay_s: 0.001" in cfg  # the slower generator


def test_versus_runs_the_async_job_again_with_its_overrides_in_the_same_round():
    import argparse

    from dapo_async.bench.async_bench import default_round

    calls = []

    def fake_runner(args, steps, root):
        def run(name, *overrides):
            calls.append((name, overrides))
            rate = {"sync": 10.0, "async": 19.0, "versus": 20.0}[name]
            return {"samples_per_s": rate, "learner_idle": 0.1, "staleness_mean": 0.5,
                    "learner_lent_s": 0.0, "generator_borrowed_s": 0.0,
                    "learner_core_idle": 0.1, "spare_cpu_s": 0.0, "learner_wait_floor": 0.04,
                    "filtered_token_share": 0.25, "stale_share": 0.02,
                    "phase1_learner_idle": 0.0,
                    "phase1_produced_per_qualified": 1.5, "phase2_learner_idle": 0.2,
                    "phase2_produced_per_qualified": 4.0}  # fmt: skip

        return run

    import dapo_async.bench.async_bench as ab

    args = argparse.Namespace(staleness=2, versus=["tracking.samples_per_step=0"])
    real, ab.round_runner = ab.round_runner, fake_runner
    try:
        out = default_round(args, 24, Path("unused"))
    finally:
        ab.round_runner = real
    assert calls[-1] == ("versus", ("buffer.max_staleness=2", "tracking.samples_per_step=0"))
    assert out["async_vs_versus"] == 19.0 / 20.0 and out["versus_samples_per_s"] == 20.0
    assert "with tracking.samples_per_step=0: 20.0 samples/s" in ab.default_summary(out)
    assert out["async_filtered_token_share"] == 0.25
    assert "(learner idle 0.10, floor 0.04)" in ab.default_summary(out)
    assert "dropped by dynamic sampling 0.25" in ab.default_summary(out)
    assert out["async_stale_share"] == 0.02 and "dropped stale 0.020" in ab.default_summary(out)
    assert out["async_phase2_produced_per_qualified"] == 4.0
    assert "thirds of the run: learner idle 0.00/0.20, groups made per qualified 1.5/4.0" in (
        ab.default_summary(out)
    )
