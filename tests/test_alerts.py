"""Alerts from the learner's metrics (``alerts.py``): each starts once with a message, stays
flagged while it lasts, clears, and a threshold of 0 turns it off; the launcher's status line
shows the active ones."""

import json

from dapo_async.alerts import NAMES, Alerts
from dapo_async.config import load_config
from dapo_async.launch.supervisor import status_line


def _step(entropy=0.5, low=0.0, high=0.0, p95=1.0, **extra):
    return {
        "train/entropy": entropy,
        "train/pg_clip_frac_low": low,
        "train/pg_clip_frac_high": high,
        "train/is_weight_p95": p95,
        **extra,
    }


def test_each_alert_starts_once_stays_flagged_and_clears():
    a = Alerts(load_config(None, []).tracking)  # 0.05 of entropy, 0.2 clipped, p95 2, drop 0.1
    flags, started = a.check(_step(**{"eval/accuracy": 0.6}))
    assert started == [] and set(flags) == {f"alert/{n}" for n in NAMES}
    assert not any(flags.values())
    flags, started = a.check(_step(entropy=0.01, low=0.15, high=0.1, p95=2.5))
    assert [m.split(" ")[0] for m in started] == ["entropy", "clipped", "importance-weight"]
    assert flags["alert/entropy_collapse"] == flags["alert/clip_runaway"] == 1.0
    flags, started = a.check(_step(entropy=0.01, p95=2.5))  # still on: flagged, not repeated
    assert started == [] and flags["alert/is_weight_tail"] == 1.0
    assert flags["alert/clip_runaway"] == 0.0  # cleared
    flags, started = a.check(_step(**{"eval/accuracy": 0.45}))  # 0.15 below the best 0.6
    assert started and "held-out accuracy fell to 0.450" in started[0]
    flags, _ = a.check(_step())  # held between evaluations
    assert flags["alert/heldout_drop"] == 1.0
    flags, _ = a.check(_step(**{"eval/accuracy": 0.58}))
    assert flags["alert/heldout_drop"] == 0.0


def test_a_zero_threshold_turns_its_alert_off():
    off = load_config(None, ["tracking.alert_clip_frac=0", "tracking.alert_entropy_frac=0"])
    a = Alerts(off.tracking)
    a.check(_step())
    flags, started = a.check(_step(entropy=0.0, low=0.9))
    assert started == [] and not flags["alert/clip_runaway"] and not flags["alert/entropy_collapse"]


def test_the_status_line_shows_the_active_alerts(tmp_path):
    (tmp_path / "metrics").mkdir()
    row = {
        "step": 3, "time": 0.0, "rollout/reward_mean": 0.1, "rollout/trained_accuracy": 0.5,
        "rollout/response_len_mean": 20.0, "staleness/mean": 0.5,
        "alert/entropy_collapse": 1.0, "alert/clip_runaway": 0.0,
    }  # fmt: skip
    (tmp_path / "metrics" / "learner.jsonl").write_text(json.dumps(row) + "\n")
    line = status_line(tmp_path, 0.0, 10)
    assert line.startswith("⚠ entropy_collapse [train") and "clip_runaway" not in line


# Sampled accuracy per step of a real asynchronous run of the main job (bench async,
# max_staleness 2, AMD EPYC, 6 Dec 2026) whose policy collapsed at step 18: every response
# turned into "…;Answer:;r:;Answer: 2r:" up to the length limit, and recovered by step 23.
COLLAPSE = [0.289, 0.336, 0.43, 0.477, 0.391, 0.688, 0.633, 0.656, 0.766, 0.703, 0.828, 0.891,
            0.68, 0.781, 0.93, 0.773, 0.484, 0.016, 0.023, 0.016, 0.484, 0.523, 0.867, 0.938]  # fmt: skip


def test_a_collapse_of_the_sampled_accuracy_alerts_at_once_and_clears_on_recovery():
    a = Alerts(load_config(None, []).tracking)  # 0.3 below the best 3-step mean
    flagged, messages = [], []
    for step, acc in enumerate(COLLAPSE, 1):
        flags, started = a.check({"rollout/sampled_accuracy": acc})
        if flags["alert/sampled_drop"]:
            flagged.append(step)
        messages += started
    assert flagged == [18, 19, 20, 21, 22]  # 3-step mean 0.42 at step 18, best 0.80
    assert len(messages) == 1 and "sampled accuracy fell to 0.424" in messages[0]
    # a step without a figure (nothing sampled) keeps the state
    a = Alerts(load_config(None, []).tracking)
    for acc in COLLAPSE[:18]:
        a.check({"rollout/sampled_accuracy": acc})
    assert a.check({"rollout/sampled_accuracy": float("nan")})[0]["alert/sampled_drop"] == 1.0
    assert a.check({})[0]["alert/sampled_drop"] == 1.0


def test_noise_of_a_learning_run_does_not_alert():
    a = Alerts(load_config(None, []).tracking)
    rising = [0.3, 0.35, 0.5, 0.4, 0.7, 0.6, 0.65, 0.8, 0.68, 0.9, 0.78, 0.93, 0.85, 0.94]
    assert not any(
        a.check({"rollout/sampled_accuracy": x})[0]["alert/sampled_drop"] for x in rising
    )
    off = Alerts(load_config(None, ["tracking.alert_sampled_drop=0"]).tracking)
    assert not any(
        off.check({"rollout/sampled_accuracy": x})[0]["alert/sampled_drop"] for x in COLLAPSE
    )
