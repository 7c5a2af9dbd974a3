"""report's distributions.png from hand-written learner records: staleness shares per step
and over the run, importance-weight quantiles; nothing drawn without those records."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from dapo_async.tools.report_dists import _staleness_panels, write_distributions


def _records():
    return [
        {
            "step": s,
            "rollout/num_tokens": 100.0 * s,
            "staleness/frac_0": 1.0 - 0.1 * s,
            "staleness/frac_1": 0.1 * s,
            "train/is_weight_p05": 0.9,
            "train/is_weight_p50": 1.0,
            "train/is_weight_p95": 1.1 + 0.01 * s,
            "train/is_weight_max": 1.5,
        }
        for s in range(1, 6)
    ]


def test_distributions_png_per_run(tmp_path):
    runs = {"a": {"learner": _records()}, "b": {"learner": _records()[:3]}}
    path = write_distributions(plt, runs, tmp_path)
    assert path == tmp_path / "distributions.png"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10000


def test_staleness_over_the_run_is_token_weighted():
    fig, (ax_t, ax_h) = plt.subplots(1, 2)
    assert _staleness_panels(ax_t, ax_h, _records())
    heights = [bar.get_height() for bar in ax_h.patches]
    weights = [100.0 * s for s in range(1, 6)]
    want_1 = sum(w * 0.1 * s for w, s in zip(weights, range(1, 6), strict=True)) / sum(weights)
    assert abs(heights[1] - want_1) < 1e-9 and abs(sum(heights) - 1.0) < 1e-9
    plt.close(fig)


def test_nothing_to_draw_without_the_records(tmp_path):
    runs = {"a": {"learner": [{"step": 1, "train/loss": 0.5}]}, "b": {"buffer": []}}
    assert write_distributions(plt, runs, tmp_path) is None
    assert not (tmp_path / "distributions.png").exists()
