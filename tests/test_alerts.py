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
