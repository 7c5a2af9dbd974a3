"""Small hand-made groups for buffer tests."""

import numpy as np

from dapo_async import protocol as P


def group(gen, seq, lease_id, acc=(1, 0), version=0, tokens_per_response=3):
    g = len(acc)
    t = g * tokens_per_response
    return P.Group(
        generator_id=gen,
        seq=seq,
        prompt_id=lease_id,
        prompt_tokens=np.array([1, 2], np.int32),
        response_lens=np.full(g, tokens_per_response, np.int32),
        tokens=np.arange(t, dtype=np.int32) % 50,
        logprobs=np.full(t, -0.5, np.float32),
        versions=np.full(t, version, np.int32),
        rewards=np.where(np.array(acc) > 0, 1.0, -1.0).astype(np.float32),
        acc=np.array(acc, np.float32),
        components=np.zeros((g, 2), np.float32),
        finish=np.zeros(g, np.uint8),
    )
