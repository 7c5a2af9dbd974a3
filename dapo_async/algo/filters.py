"""Dynamic sampling (DAPO) and overlong filtering predicates. numpy only, so the buffer, which
never imports torch, uses the same code as the learner.

Dynamic sampling keeps a group only if its filter metric varies within the group (max − min >
ZERO_VARIANCE_TOL: not all correct, not all wrong; a group of one response never varies and is
dropped), optionally also only if its mean accuracy lies in [min_acc, max_acc] (a band-pass). Overlong filtering masks the loss of truncated responses.
"""

from __future__ import annotations

import numpy as np

# Values closer than this count as equal (rewards are float32 sums of components).
ZERO_VARIANCE_TOL = 1e-6


def dynamic_sampling_keep(
    metric_R: np.ndarray,
    num_responses_K: np.ndarray,
    acc_R: np.ndarray | None = None,
    min_acc: float = 0.0,
    max_acc: float = 1.0,
) -> np.ndarray:
    """Boolean [K]: groups to keep. ``metric_R`` holds the filter metric of every response,
    grouped consecutively by ``num_responses_K``."""
    metric_R = np.asarray(metric_R, dtype=np.float64)
    sizes = np.asarray(num_responses_K, dtype=np.int64)
    if sizes.size == 0:
        return np.zeros(0, dtype=bool)
    if (sizes < 1).any() or sizes.sum() != metric_R.shape[0]:
        raise ValueError("num_responses_K must be >= 1 and sum to len(metric_R)")
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    gmax = np.maximum.reduceat(metric_R, starts)
    gmin = np.minimum.reduceat(metric_R, starts)
    keep = (gmax - gmin) > ZERO_VARIANCE_TOL
    if acc_R is not None and (min_acc > 0.0 or max_acc < 1.0):
        mean_acc = np.add.reduceat(np.asarray(acc_R, dtype=np.float64), starts) / sizes
        keep &= (mean_acc >= min_acc) & (mean_acc <= max_acc)
    return keep


def overlong_filter_mask(truncated_B: np.ndarray) -> np.ndarray:
    """1.0 for responses whose loss counts, 0.0 for truncated ones."""
    return (~np.asarray(truncated_B, dtype=bool)).astype(np.float32)
