"""The KS statistic and quantiles on histograms, against hand-checked cases."""

import random
from collections import Counter

import pytest

from dapo_async.bench.stats import ks_two_sample, quantile


def test_ks_of_equal_and_of_shifted_distributions():
    rng = random.Random(0)
    a = Counter(rng.randint(1, 50) for _ in range(3000))
    b = Counter(rng.randint(1, 50) for _ in range(3000))
    d_same, p_same = ks_two_sample(a, b)
    assert d_same < 0.05 and p_same > 0.05
    shorter = Counter(rng.randint(1, 40) for _ in range(3000))  # long responses missing
    d, p = ks_two_sample(a, shorter)
    assert d == pytest.approx(0.2, abs=0.04) and p < 1e-6


def test_ks_by_hand_and_quantiles():
    # {1: 1, 2: 1} vs {2: 2}: ECDFs differ by 0.5 at 1
    assert ks_two_sample({1: 1, 2: 1}, {2: 2})[0] == pytest.approx(0.5)
    assert ks_two_sample({}, {1: 1})[0] != ks_two_sample({}, {1: 1})[0]  # nan: no data
    h = {1: 5, 10: 90, 70: 5}
    assert quantile(h, 0.05) == 1 and quantile(h, 0.5) == 10 and quantile(h, 0.96) == 70
