"""bench/common.py: the steady-state window's figures, the spares' share of the learner's wait
(``learner_core_idle``) included."""

import json

import pytest

from dapo_async.bench.common import collapsed_steps, spare_cpu_s, window_core_idle


def _write(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_core_idle_is_the_learners_wait_less_what_spares_computed_in_the_window(tmp_path):
    metrics = tmp_path / "metrics"
    # a spare's CPU time: 3 s of start-up before its first report, then +2 s between t=10 and 20
    _write(metrics / "spare0-ab.jsonl", [
        {"time": 5.0, "cores/cpu_s": 3.0},
        {"time": 10.0, "cores/cpu_s": 3.5},
        {"time": 20.0, "cores/cpu_s": 5.5},
        {"time": 30.0, "cores/cpu_s": 9.0},
    ])  # fmt: skip
    _write(metrics / "gen0-cd.jsonl", [{"time": 10.0, "cores/cpu_s": 100.0}])  # not a spare
    assert spare_cpu_s(tmp_path, 10.0, 20.0) == pytest.approx(2.0)
    assert spare_cpu_s(tmp_path, 0.0, 20.0) == pytest.approx(2.5)  # start-up is not counted
    start = {"time": 10.0}
    window = [{"time": 15.0, "time/wait_data_s": 2.0}, {"time": 20.0, "time/wait_data_s": 1.0}]
    out = window_core_idle(tmp_path, start, window)
    assert out["spare_cpu_s"] == pytest.approx(2.0)
    assert out["learner_core_idle"] == pytest.approx((3.0 - 2.0) / 10.0)
    # spares that computed more than the learner waited (they also fill its short gaps): 0
    window[1]["time/wait_data_s"] = 0.0
    assert window_core_idle(tmp_path, start, window)["learner_core_idle"] == 0.0


def test_without_spares_core_idle_is_the_learners_idle(tmp_path):
    start = {"time": 0.0}
    window = [{"time": 4.0, "time/wait_data_s": 1.0}]
    assert window_core_idle(tmp_path, start, window) == {
        "spare_cpu_s": 0.0,
        "learner_core_idle": 0.25,
    }


def test_collapsed_steps_are_those_the_learner_flagged_sampled_drop(tmp_path):
    rows = [{"step": s, "alert/sampled_drop": float(s in (5, 6))} for s in range(1, 9)]
    _write(tmp_path / "metrics" / "learner.jsonl", [{"step": 0}, *rows])
    assert collapsed_steps(tmp_path) == [5, 6]
