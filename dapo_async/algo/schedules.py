"""Learning-rate schedules as multipliers of the base rate (pure math, no optimizer).

    warm-up    step < W:        (step + 1) / W
    constant   after warm-up:   1
    linear     after warm-up:   1 − (1 − m)·p          p = (step − W) / max(N − W, 1), clamped to 1
    cosine     after warm-up:   m + (1 − m)·(1 + cos(π·p)) / 2

N = learner.num_steps, W = learner.warmup_steps, m = learner.lr_min_ratio (the floor). ``step``
counts optimizer-schedule steps from 0, so the first update uses multiplier(0).
"""

from __future__ import annotations

import math

SCHEDULES = ("constant", "linear", "cosine")


def lr_multiplier(step: int, num_steps: int, warmup: int, kind: str, min_ratio: float) -> float:
    if kind not in SCHEDULES:
        raise ValueError(f"learner.lr_schedule must be one of {SCHEDULES}, got {kind!r}")
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    if kind == "constant":
        return 1.0
    p = min(1.0, (step - warmup) / max(num_steps - warmup, 1))
    if kind == "linear":
        return 1.0 - (1.0 - min_ratio) * p
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * p))
