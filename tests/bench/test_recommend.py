"""tune --recommend's model: per-role capacities from a run's metrics, and the split it
predicts for a budget (hand-written records and rates; the end-to-end run is in test_tune)."""

import json

import pytest

from dapo_async.bench.recommend import predict, role_rates, share


def test_share_of_a_core():
    assert share(2, 2) == 1.0 and share(4, 2) == 0.5 and share(1, 8) == 1.0


def test_the_bottleneck_role_gets_the_processes():
    # generators are 3x slower than a learner rank: more of them, until the learner binds
    rates = {"learner_per_rank": 30.0, "generator_each": 10.0}
    best = predict(rates, probe=(1, 1), budget=4, cores=4)[0]
    assert (best["learners"], best["generators"]) == (1, 3)
    assert best["predicted_samples_per_s"] == pytest.approx(30.0)
    # the learner is the slow side: ranks, not generators
    rates = {"learner_per_rank": 5.0, "generator_each": 40.0}
    best = predict(rates, probe=(1, 1), budget=4, cores=4)[0]
    assert (best["learners"], best["generators"]) == (3, 1)
    assert best["bottleneck"] == "learner"


def test_oversubscribed_cores_scale_every_process_down():
    rates = {"learner_per_rank": 10.0, "generator_each": 10.0}
    cands = predict(rates, probe=(1, 1), budget=4, cores=2)
    # 2 + 2 processes on 2 cores: each gets half a core, so no gain over 1 + 1; the tie goes
    # to fewer processes
    assert (cands[0]["learners"], cands[0]["generators"]) == (1, 1)
    by_split = {(c["learners"], c["generators"]): c["predicted_samples_per_s"] for c in cands}
    assert by_split[(2, 2)] == pytest.approx(10.0) and by_split[(1, 3)] == pytest.approx(5.0)
    # a split the config rejects is never proposed
    cands = predict(rates, (1, 1), 4, 4, valid=lambda learners, gens: learners == 1)
    assert {c["learners"] for c in cands} == {1}


def _write(run, name, recs):
    (run / "metrics").mkdir(parents=True, exist_ok=True)
    (run / "metrics" / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))


def test_rates_from_a_runs_metrics(tmp_path):
    # 4 steps of 16 responses, 2 s apart; the learner waits 0.5 s of each 2 s; 5 groups of 4
    # responses qualify per step; the generator idles 0.2 s per 2 s
    learner = [
        {"step": s, "time": 100.0 + 2 * s, "rollout/num_responses": 16.0,
         "time/wait_data_s": 0.5, "buffer/qualified": 5 * s}
        for s in range(1, 5)
    ]  # fmt: skip
    gen = [
        {"step": s, "time": 100.0 + 2 * s, "generator/idle_s": 0.2 * s,
         "generator/idle_ratio": 0.5}
        for s in range(1, 5)
    ]  # fmt: skip
    _write(tmp_path, "learner", learner)
    _write(tmp_path, "gen0", gen)
    r = role_rates(tmp_path, skip=1, learners=1, generators=1, responses=4)
    assert r["samples_per_s"] == pytest.approx(8.0)
    assert r["learner_idle"] == pytest.approx(0.25)
    assert r["generator_idle"] == pytest.approx(0.1)
    assert r["learner_per_rank"] == pytest.approx(8.0 / 0.75)
    assert r["generator_each"] == pytest.approx(10.0 / 0.9)
    with pytest.raises(RuntimeError, match="fewer than"):
        role_rates(tmp_path, skip=3, learners=1, generators=1, responses=4)
