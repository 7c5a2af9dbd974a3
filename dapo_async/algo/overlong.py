"""DAPO's soft overlong punishment, added to the correctness reward.

R_len(y) = 0                                 if |y| ≤ L_max − L_cache
         = ((L_max − L_cache) − |y|) / L_cache   if L_max − L_cache < |y| ≤ L_max
         = −1                                if |y| > L_max
"""

from __future__ import annotations


def overlong_penalty(length: int, max_len: int, cache_len: int) -> float:
    if not 0 < cache_len < max_len:
        raise ValueError("need 0 < cache_len < max_len")
    free = max_len - cache_len
    if length <= free:
        return 0.0
    if length <= max_len:
        return (free - length) / cache_len
    return -1.0
