"""Held-out evaluation off the learner's critical path: with learner.eval_every the learner
writes a weight snapshot per evaluation and goes on; the launcher's evaluator role evaluates
each on the generators' engine and records eval/* at that version (metrics/evaluator.jsonl),
the evaluations before and after training included (eval_before.json, eval_after.json)."""

import json
from pathlib import Path

from testutil import TRAIN_FAST, last_json, run_cli

REPO = Path(__file__).resolve().parents[2]


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_periodic_evaluation_runs_in_the_evaluator_role(tiny_model, tmp_path, cli_env):
    run = tmp_path / "run"
    out = run_cli(
        REPO, cli_env, "train", "configs/tiny_cpu.yaml", f"model.path={tiny_model}",
        f"run_dir={run}", "learner.num_steps=4", "learner.eval_every=1", *TRAIN_FAST, "--json",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert last_json(out)["steps"] == 4
    learner = _rows(run / "metrics" / "learner.jsonl")
    # the learner only wrote snapshots at steps 1..3 (step 4's evaluation is the final one)
    waits = [r["time/eval_s"] for r in learner if "time/eval_s" in r]
    assert len(waits) == 3
    assert not any("eval/accuracy" in r for r in learner)  # it evaluated nothing itself
    log = (run / "logs" / "evaluator.log").read_text()
    assert "held-out accuracy before training" in log, log[-2000:]
    assert "held-out accuracy after training" in log, log[-2000:]
    evals = _rows(run / "metrics" / "evaluator.jsonl")
    assert evals and all(0.0 <= r["eval/accuracy"] <= 1.0 for r in evals)
    assert {r["step"] for r in evals} == {0, 1, 2, 3, 4}  # before, periodic, after
    # the run's summary has the evaluator's before/after figures, written before `train` ended
    summary = last_json(out)
    by_step = {r["step"]: r["eval/accuracy"] for r in evals}
    assert summary["heldout_accuracy_before"] == by_step[0]
    assert summary["heldout_accuracy_after"] == by_step[4]
    assert not list((run / "eval_snapshots").iterdir())  # every request was served


def test_a_summary_from_an_earlier_session_does_not_end_the_evaluator(tmp_path):
    """A resumed run (or a resubmitted Slurm job) starts its evaluator while the first
    session's learner_summary.json may still be there: it counts only once written after the
    evaluator started, or after the grace (an evaluator restarted after the learner's end)."""
    import os
    import time

    from dapo_async import eval_snapshots

    started = time.time()
    assert not eval_snapshots.learner_finished(tmp_path, started)
    summary = tmp_path / eval_snapshots.SUMMARY_FILE
    summary.write_text("{}")
    os.utime(summary, (started - 3600, started - 3600))  # the earlier session's
    assert not eval_snapshots.learner_finished(tmp_path, started, grace_s=300)
    assert eval_snapshots.learner_finished(tmp_path, started - 301, grace_s=300)
    os.utime(summary, (started + 1, started + 1))  # this session's learner finished
    assert eval_snapshots.learner_finished(tmp_path, started, grace_s=300)
