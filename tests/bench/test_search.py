"""`dapo-async tune --search` (``bench/search.py``): the search space and the config's own values
as its first trial; a trial the pruner stops has its training stopped at once (a scripted
trainer writing a learning curve); and the real search on the tiny policy, resumed."""

import sys
import time

import optuna
import pytest
from testutil import last_json, run_cli

from dapo_async.bench import search
from dapo_async.config import load_config


def test_the_space_parses_ranges_and_refuses_bad_ones():
    lr, clip, n = search.parse_space(
        ["learner.lr=1e-4:3e-3:log", "algo.clip_high=0.2:0.35", "learner.num_minibatches=1:4"]
    )
    assert (lr.log, lr.integer, clip.log, n.integer) == (True, False, False, True)
    for bad in ("learner.lr", "learner.lr=3:1", "learner.lr=0:1:log", "a=1:2:sqrt", "a=x:2"):
        with pytest.raises(SystemExit, match="--search"):
            search.parse_space([bad])


def test_the_config_as_given_is_the_first_trial_when_it_lies_in_the_ranges():
    cfg = load_config("configs/tiny_cpu.yaml", [])
    space = search.parse_space(["learner.lr=1e-4:3e-3:log", "algo.clip_high=0.2:0.35"])
    assert search.defaults(cfg, space) == {"learner.lr": 1.5e-4, "algo.clip_high": 0.28}
    assert search.defaults(cfg, search.parse_space(["learner.lr=1e-3:3e-3"])) is None


SCRIPTED = """
import json, sys, time, pathlib
run, values = pathlib.Path(sys.argv[1]), [float(v) for v in sys.argv[2].split(",")]
(run / "metrics").mkdir(parents=True)
with open(run / "metrics" / "learner.jsonl", "a") as f:
    for step, v in enumerate(values, 1):
        time.sleep(0.3)
        f.write(json.dumps({"step": step, "time": time.time(), "eval/accuracy": v}) + "\\n")
        f.flush()
time.sleep(float(sys.argv[3]))
(run / "finished").write_text("1")
"""


def test_a_pruned_trial_is_stopped_at_once_and_a_finished_one_gives_its_last_value(tmp_path):
    study = optuna.create_study(
        direction="maximize",
        pruner=optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=0),
    )
    script = tmp_path / "trainer.py"
    script.write_text(SCRIPTED)

    def trial(curve: str, linger_s: float) -> tuple[str, float]:
        t = study.ask()
        run = tmp_path / f"t{t.number}"
        t0 = time.monotonic()
        cmd = [sys.executable, str(script), str(run), curve, str(linger_s)]
        try:
            value = search.run_trial(t, cmd, run, "heldout", deadline=time.monotonic() + 120)
        except optuna.TrialPruned:
            study.tell(t, state=optuna.trial.TrialState.PRUNED)
            return "pruned", time.monotonic() - t0
        study.tell(t, value)
        return f"{value:.1f}", time.monotonic() - t0

    assert trial("0.5,0.6,0.7", 0)[0] == "0.7"
    assert trial("0.6,0.7,0.8", 0)[0] == "0.8"
    state, _ = trial("0.1,0.1,0.1", 600)  # far below the median at its first report
    assert state == "pruned"
    assert not (tmp_path / "t2" / "finished").exists()  # stopped, not waited for
    assert (tmp_path / "t2.log").exists()


@pytest.mark.slow
def test_a_search_on_the_tiny_policy_prunes_writes_the_best_config_and_resumes(
    tiny_model, tmp_path, repo, cli_env
):
    fast = [
        f"model.path={tiny_model}", "buffer.groups_per_step=4", "generator.prompts_per_batch=4",
        "generator.responses_per_prompt=4", "data.num_eval=32", "tracking.aim=true",
        "buffer.dynamic_sampling=false",
    ]  # fmt: skip
    out_dir = tmp_path / "runs" / "s"
    args = [
        "tune", "configs/tiny_cpu.yaml", *fast, "--search", "learner.lr=1e-4:3e-3:log",
        "--steps", "4", "--eval-every", "2", "--out", out_dir, "--json",
    ]  # fmt: skip
    out = run_cli(repo, cli_env, *args, "--trials", "2", timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    res = last_json(out)
    assert len(res["trials"]) == 2 and res["trials"][0]["default"]
    assert res["trials"][0]["params"] == {"learner.lr": 1.5e-4}  # the config as given
    assert res["default"]["value"] == res["trials"][0]["value"]
    assert res["best"]["value"] >= res["default"]["value"]
    for t in res["trials"]:  # every evaluation after step 0 reached the pruner
        assert t["state"] == "complete" and t["last_step"] == 4
    best = (out_dir / "best.yaml").read_text()
    assert best.startswith("# dapo-async tune: trial")
    cfg = load_config(str(out_dir / "best.yaml"), [])
    assert cfg.learner.lr == pytest.approx(res["best"]["params"]["learner.lr"])
    again = run_cli(repo, cli_env, *args, "--trials", "2", timeout=60)
    assert again.returncode != 0 and "--resume" in again.stderr  # never overwrites a study
    more = run_cli(repo, cli_env, *args, "--trials", "3", "--resume", timeout=900)
    assert more.returncode == 0, more.stderr[-3000:]
    assert [t["number"] for t in last_json(more)["trials"]] == [0, 1, 2]
    from aim import Repo

    tagged = [
        r for r in Repo(str(tmp_path / "runs" / "aim")).iter_runs()
        if r.name.endswith("/learner") and any(t.startswith("learner.lr=") for t in r.props.tags)
    ]  # fmt: skip
    assert len(tagged) == 3  # each trial an Aim run tagged with its values
