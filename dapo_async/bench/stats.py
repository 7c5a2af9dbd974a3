"""Small statistics for bench reports, on histograms (value -> count), no scipy."""

from __future__ import annotations

import math


def ks_two_sample(a: dict[int, int], b: dict[int, int]) -> tuple[float, float]:
    """Two-sample Kolmogorov–Smirnov statistic D of two histograms and its asymptotic p-value
    (Kolmogorov distribution with Stephens' small-sample correction)."""
    n, m = sum(a.values()), sum(b.values())
    if not n or not m:
        return float("nan"), float("nan")
    ca = cb = 0
    d = 0.0
    for v in sorted(set(a) | set(b)):
        ca += a.get(v, 0)
        cb += b.get(v, 0)
        d = max(d, abs(ca / n - cb / m))
    ne = n * m / (n + m)
    lam = (math.sqrt(ne) + 0.12 + 0.11 / math.sqrt(ne)) * d
    if lam < 1e-3:
        return d, 1.0
    p = 2 * sum((-1) ** (k - 1) * math.exp(-2 * k * k * lam * lam) for k in range(1, 101))
    return d, min(1.0, max(0.0, p))


def quantile(hist: dict[int, int], q: float) -> float:
    """The ``q`` quantile of a histogram (smallest value with cumulative share ≥ q)."""
    total = sum(hist.values())
    acc = 0
    for v in sorted(hist):
        acc += hist[v]
        if acc >= q * total:
            return float(v)
    return float("nan")
