"""bench/common.py: the steady-state window's figures, the spares' share of the learner's wait
(``learner_core_idle``) included."""

import json

import pytest

from dapo_async.bench.common import (
    collapsed_steps,
    generators_busy_share,
    machine,
    spare_cpu_s,
    wait_floor,
    window_core_idle,
    window_phases,
    window_wait_floor,
)


def _write(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _series(key, points):
    """Metrics records of one counter: (time, value) pairs."""
    return [{"time": t, key: v} for t, v in points]


def test_core_idle_is_the_learners_wait_less_what_spares_computed_in_the_window(tmp_path):
    metrics = tmp_path / "metrics"
    # a spare's CPU time: 3 s of start-up before its first report, then +2 s between t=10 and 20
    points = [(5.0, 3.0), (10.0, 3.5), (20.0, 5.5), (30.0, 9.0)]
    _write(metrics / "spare0-ab.jsonl", _series("cores/cpu_s", points))
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


def test_the_wait_floor_is_what_a_perfect_split_of_the_cores_would_leave():
    # 2 cores, learner 6 s of work, generators 10 s: a window can shrink to 8 s, the learner
    # busy 6 of them: it waits a quarter however the cores are split
    assert wait_floor(6.0, 10.0, 2) == pytest.approx(0.25)
    assert wait_floor(6.0, 6.0, 2) == 0.0  # balanced: nothing left to wait for
    assert wait_floor(8.0, 4.0, 2) == 0.0  # the learner's own work sets the window
    assert wait_floor(6.0, 10.0, 1) == pytest.approx(10 / 16)  # one core: roles take turns
    assert wait_floor(0.0, 0.0, 2) == 0.0


def test_generators_busy_share_is_each_generators_share_not_idle_summed(tmp_path):
    metrics = tmp_path / "metrics"
    # idle 1 s of the 10 between its reports at t=10 and t=20: busy 0.9
    points = [(5.0, 4.0), (10.0, 4.5), (20.0, 5.5), (30.0, 9.0)]
    _write(metrics / "gen0-ab.jsonl", _series("generator/idle_s", points))
    # a second one that never idled; a spare (counted by its CPU seconds instead); the learner
    _write(metrics / "gen1-cd.jsonl", _series("generator/idle_s", [(10.0, 0.0), (20.0, 0.0)]))
    _write(metrics / "spare0-ef.jsonl", [{"time": 10.0, "generator/idle_s": 0.0}])
    _write(metrics / "learner.jsonl", [{"time": 10.0, "time/wait_data_s": 1.0}])
    assert generators_busy_share(tmp_path, 10.0, 20.0) == pytest.approx(0.9 + 1.0)
    # one generator: learner busy 10 − 3 = 7 s, generation 0.9 × 10 = 9 s on 2 cores
    start = {"time": 10.0}
    window = [{"time": 15.0, "time/wait_data_s": 2.0}, {"time": 20.0, "time/wait_data_s": 1.0}]
    (metrics / "gen1-cd.jsonl").unlink()
    assert window_wait_floor(tmp_path, start, window, 2) == pytest.approx(1 - 2 * 7 / 16)
    # a spare's CPU seconds count as generation: +2 s
    _write(metrics / "spare0-ef.jsonl", _series("cores/cpu_s", [(10.0, 1.0), (20.0, 3.0)]))
    assert window_wait_floor(tmp_path, start, window, 2) == pytest.approx(1 - 2 * 7 / 18)


def test_collapsed_steps_are_those_the_learner_flagged_sampled_drop(tmp_path):
    rows = [{"step": s, "alert/sampled_drop": float(s in (5, 6))} for s in range(1, 9)]
    _write(tmp_path / "metrics" / "learner.jsonl", [{"step": 0}, *rows])
    assert collapsed_steps(tmp_path) == [5, 6]


def test_phases_split_the_window_into_thirds_with_their_idle_and_groups_made_per_qualified():
    """Each part: the learner's wait over its wall time, and groups produced per qualified one
    between the record before the part and its last record."""
    start = {"step": 2, "time": 0.0, "buffer/produced": 100, "buffer/qualified": 80}
    window, produced, qualified = [], 100, 80
    for i, (made, passed, wait) in enumerate(
        [(12, 10, 0.0), (14, 10, 0.0), (25, 10, 0.5), (35, 10, 1.0), (40, 10, 1.0), (50, 10, 1.5)]
    ):
        produced, qualified = produced + made, qualified + passed
        window.append({"step": 3 + i, "time": 2.0 * (i + 1), "time/wait_data_s": wait,
                       "buffer/produced": produced, "buffer/qualified": qualified})  # fmt: skip
    parts = window_phases(start, window)
    assert [p["steps"] for p in parts] == [[3, 4], [5, 6], [7, 8]]
    assert [p["learner_idle"] for p in parts] == pytest.approx([0.0, 1.5 / 4, 2.5 / 4])
    assert [p["produced_per_qualified"] for p in parts] == pytest.approx([1.3, 3.0, 4.5])
    # fewer steps than parts: no empty part; no buffer counters: NaN, not an error
    bare = [{"step": 3, "time": 1.0, "time/wait_data_s": 0.2}]
    (only,) = window_phases({"step": 2, "time": 0.0}, bare)
    assert (
        only["learner_idle"] == pytest.approx(0.2)
        and only["produced_per_qualified"] != only["produced_per_qualified"]
    )


def test_machine_names_the_cpu_its_cores_and_its_data_caches(tmp_path):
    from dapo_async.tiny.build import cpu_model

    caches = {"index0": ("1", "Data", "48K"), "index1": ("1", "Instruction", "32K"),
              "index2": ("2", "Unified", "1024K"), "index3": ("3", "Unified", "32768K")}  # fmt: skip
    for index, values in caches.items():
        (tmp_path / index).mkdir()
        for name, value in zip(("level", "type", "size"), values):
            (tmp_path / index / name).write_text(value + "\n")
    (tmp_path / "index4").mkdir()  # unreadable (no files): left out
    text = machine(tmp_path)
    assert text.startswith(cpu_model() + ", ") and text.endswith(", L1d 48K, L2 1024K, L3 32768K")
    assert " cores" in machine(tmp_path / "missing")  # no cache folder: model and cores only
