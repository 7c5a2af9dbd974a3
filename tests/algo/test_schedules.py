"""Learning-rate multipliers: warm-up, then constant, linear or cosine down to the floor."""

import itertools
import math

import pytest

from dapo_async.algo.schedules import lr_multiplier


def test_warmup_then_constant_is_the_old_schedule():
    got = [lr_multiplier(s, 10, 2, "constant", 0.0) for s in range(10)]
    assert got == [min(1.0, (s + 1) / 2) for s in range(10)]


def test_linear_and_cosine_reach_the_floor_at_the_last_step():
    n, w, m = 12, 2, 0.1
    for kind in ("linear", "cosine"):
        assert lr_multiplier(w, n, w, kind, m) == pytest.approx(1.0)  # right after warm-up
        assert lr_multiplier(n, n, w, kind, m) == pytest.approx(m)
        assert lr_multiplier(n + 5, n, w, kind, m) == pytest.approx(m)  # clamped past the end
        vals = [lr_multiplier(s, n, w, kind, m) for s in range(w, n + 1)]
        assert all(a >= b for a, b in itertools.pairwise(vals))  # never rises
    mid = w + (n - w) // 2
    assert lr_multiplier(mid, n, w, "linear", m) == pytest.approx(1 - (1 - m) * 0.5)
    assert lr_multiplier(mid, n, w, "cosine", m) == pytest.approx(m + (1 - m) * 0.5)
    assert lr_multiplier(w + 1, n, w, "cosine", 0) == pytest.approx(
        0.5 * (1 + math.cos(math.pi / (n - w)))
    )


def test_unknown_schedule_is_refused():
    with pytest.raises(ValueError, match="lr_schedule"):
        lr_multiplier(0, 10, 0, "step", 0.0)
