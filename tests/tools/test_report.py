"""`dapo-async report`'s figure table read against hand-written metrics files: which series
each figure draws (learner metrics by default, ``role:metric`` for other roles)."""

import json

from dapo_async.tools.report import PLOTS, _draw_panel, write_report


class _Axis:
    """Records what a panel plots (matplotlib's Axes.plot signature, labels only)."""

    def __init__(self):
        self.labels = []

    def plot(self, xs, ys, **kw):
        self.labels.append(kw["label"])


def _series():
    return {
        "learner": [{"step": s, "time": 10.0 + s, "eval/accuracy": 0.2, "learner/idle_ratio": 0.1}
                    for s in (0, 5)],
        "evaluator": [{"step": 5, "time": 16.0, "eval/accuracy": 0.6}],
        "gen0": [{"step": 1, "time": 11.0, "generator/idle_ratio": 0.3}],
        "gen1": [{"step": 1, "time": 12.0, "generator/idle_ratio": 0.4}],
    }  # fmt: skip


def test_a_series_names_its_role_or_is_the_learners():
    runs, starts = {"r": _series()}, {"r": 10.0}
    ax = _Axis()
    assert _draw_panel(ax, runs, PLOTS["summary.png"].panels["accuracy"], "step", starts) == 2
    assert ax.labels == ["held-out accuracy", "held-out accuracy (evaluator)"]
    ax = _Axis()
    assert _draw_panel(ax, runs, PLOTS["idle.png"].panels["fraction of time"], "time", starts) == 3
    assert ax.labels == ["learner", "generator (gen0)", "generator (gen1)"]


def test_write_report_skips_figures_without_data(tmp_path):
    run = tmp_path / "run"
    (run / "metrics").mkdir(parents=True)
    for role, records in _series().items():
        lines = [json.dumps(r) for r in records] + ['{"cut by a cra']
        (run / "metrics" / f"{role}.jsonl").write_text("\n".join(lines))
    written, skipped = write_report([run], tmp_path / "out")
    assert sorted(p.name for p in written) == ["idle.png", "reward_accuracy.png", "summary.png"]
    assert "training.png" in skipped and "throughput.png" in skipped
    assert all(p.read_bytes()[:4] == b"\x89PNG" for p in written)
