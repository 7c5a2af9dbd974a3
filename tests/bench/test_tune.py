"""`dapo-async tune` runs one short training job per grid point and reports them sorted; a bad
point is reported, not fatal."""

import json
import subprocess
import sys

import pytest

FAST = [
    "buffer.groups_per_step=4",
    "generator.prompts_per_batch=4",
    "generator.responses_per_prompt=4",
    "data.num_eval=8",
    "buffer.dynamic_sampling=false",
]


@pytest.mark.slow
def test_tune_sweeps_a_grid(tiny_model, tmp_path, repo, cli_env):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "dapo_async.cli",
            "tune",
            "configs/tiny_cpu.yaml",
            f"model.path={tiny_model}",
            *FAST,
            "--grid",
            "buffer.max_staleness=0,1",
            "--grid",
            "learner.num_minibatches=0",  # invalid: reported, not fatal
            "--steps",
            "4",
            "--out",
            str(tmp_path),
            "--json",
        ],
        capture_output=True,
        text=True,
        cwd=repo,
        env=cli_env,
        timeout=900,
    )
    assert out.returncode == 1  # no valid point: every point has num_minibatches=0
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["best"] is None and len(res["results"]) == 2
    assert all("num_minibatches" in r["error"] for r in res["results"])

    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "dapo_async.cli",
            "tune",
            "configs/tiny_cpu.yaml",
            f"model.path={tiny_model}",
            *FAST,
            "--grid",
            "buffer.max_staleness=0,1",
            "--steps",
            "4",
            "--out",
            str(tmp_path / "b"),
            "--json",
        ],
        capture_output=True,
        text=True,
        cwd=repo,
        env=cli_env,
        timeout=900,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    points = [r["point"]["buffer.max_staleness"] for r in res["results"]]
    assert sorted(points) == ["0", "1"]
    rates = [r["samples_per_s"] for r in res["results"]]
    assert res["best"]["samples_per_s"] == max(rates) > 0
