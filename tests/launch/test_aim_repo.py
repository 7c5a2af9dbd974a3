"""One Aim repo per project: two training runs and a two-point tune sweep land in the repo beside
their run directories, each role an Aim run named <run dir>/<role>, tune points tagged with their
grid values and carrying the resolved config; read back through Aim's Python API as a user
opens it (no reindex)."""

import pytest
from testutil import TRAIN_FAST, last_json, run_cli

FAST = [*TRAIN_FAST, "tracking.aim=true"]


@pytest.mark.slow
def test_runs_and_tune_points_share_one_aim_repo(tiny_model, tmp_path, repo, cli_env):
    from aim import Repo

    root = tmp_path / "runs"
    common = ["configs/tiny_cpu.yaml", f"model.path={tiny_model}", *FAST]
    for name in ("a", "b"):
        args = ("train", *common, "learner.num_steps=2", f"run_dir={root / name}", "--json")
        out = run_cli(repo, cli_env, *args)
        assert out.returncode == 0, out.stderr[-3000:]
    out = run_cli(
        repo, cli_env, "tune", *common, "--grid", "buffer.max_staleness=0,1", "--steps", "4",
        "--out", root / "sweep", "--json", timeout=900,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert len(last_json(out)["results"]) == 2
    aim = root / "aim"  # listed without `aim storage reindex`: each run indexed its own
    runs = {run.name: run for run in Repo(str(aim)).iter_runs()}
    learners = sorted(n for n in runs if n.endswith("/learner"))
    assert learners == ["a/learner", "b/learner", *(f"sweep-{i:03d}/learner" for i in range(2))]
    assert any(n.startswith("a/gen0-") for n in runs) and "a/buffer" in runs
    point_tags = {tuple(sorted(runs[f"sweep-{i:03d}/learner"].props.tags)) for i in range(2)}
    assert len(point_tags) == 2  # each point distinguishable by its grid values
    assert all(any(t.startswith("buffer.max_staleness=") for t in tags) for tags in point_tags)
    learner_a = runs["a/learner"]
    assert learner_a["run_id"] == "a" and learner_a["hparams"]["learner"]["num_steps"] == 2
    assert learner_a.experiment == "tiny-dapo"
