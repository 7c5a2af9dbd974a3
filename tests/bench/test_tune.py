"""`dapo-async tune` runs one short training job per grid point and reports them sorted; a bad
point is reported, not fatal."""

import pytest
from testutil import last_json, run_cli

FAST = [
    "buffer.groups_per_step=4",
    "generator.prompts_per_batch=4",
    "generator.responses_per_prompt=4",
    "data.num_eval=8",
    "buffer.dynamic_sampling=false",
]


def tune(repo, env, tiny_model, out_dir, *grid):
    args = ["tune", "configs/tiny_cpu.yaml", f"model.path={tiny_model}", *FAST]
    return run_cli(repo, env, *args, *grid, "--steps", "4", "--out", out_dir, "--json", timeout=900)


@pytest.mark.slow
def test_tune_sweeps_a_grid(tiny_model, tmp_path, repo, cli_env):
    # an invalid value at every point: each is reported with the key, none crashes the sweep
    out = tune(
        repo,
        cli_env,
        tiny_model,
        tmp_path / "a",
        "--grid",
        "buffer.max_staleness=0,1",
        "--grid",
        "learner.num_minibatches=0",
    )
    assert out.returncode == 1
    res = last_json(out)
    assert res["best"] is None and len(res["results"]) == 2
    assert all("num_minibatches" in r["error"] for r in res["results"])

    out = tune(repo, cli_env, tiny_model, tmp_path / "b", "--grid", "buffer.max_staleness=0,1")
    assert out.returncode == 0, out.stderr[-3000:]
    res = last_json(out)
    assert sorted(r["point"]["buffer.max_staleness"] for r in res["results"]) == ["0", "1"]
    rates = [r["samples_per_s"] for r in res["results"]]
    assert res["best"]["samples_per_s"] == max(rates) > 0
    assert res["plot"].endswith("tune.png") and (tmp_path / "b" / "tune.png").is_file()


def test_tune_plots_the_grid_it_measured(tmp_path):
    from dapo_async.bench.tune import plot_grid

    results = [
        {"point": {"a": "1", "b": "x"}, "samples_per_s": 50.0, "learner_idle": 0.4},
        {"point": {"a": "2", "b": "x"}, "samples_per_s": 80.0, "learner_idle": 0.2},
        {"point": {"a": "3", "b": "x"}, "error": "failed"},
    ]
    path = plot_grid(results, tmp_path / "tune.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000
    assert plot_grid(results[2:], tmp_path / "none.png") is None  # nothing measured


@pytest.mark.slow
def test_tune_recommends_a_split_and_verifies_it(tiny_model, tmp_path, repo, cli_env):
    """No grid: the config as given is the probe; the recommendation for 2 processes on this
    machine's cores is run once and both figures are reported (their agreement is a figure
    for docs/results.md, not an assertion: the machine is shared)."""
    out = tune(repo, cli_env, tiny_model, tmp_path / "r", "--recommend", "--budget", "2")
    assert out.returncode == 0, out.stderr[-3000:]
    res = last_json(out)
    rec = res["recommend"]
    assert rec["split"] == {"learner.num_ranks": 1, "generator.num_generators": 1}
    assert res["predicted_samples_per_s"] == rec["predicted_samples_per_s"] > 0
    assert res["measured_samples_per_s"] == rec["measured_samples_per_s"] > 0
    assert rec["probe"]["learner_per_rank"] > 0 and rec["probe"]["generator_each"] > 0
    assert (tmp_path / "r" / "r-verify" / "metrics" / "learner.jsonl").is_file()
    assert "recommended for 2 processes" in out.stderr
