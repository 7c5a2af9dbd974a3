"""Build scored groups from engine completions: the part of a generator step between the engine
and the wire (``GeneratorLoop.rollout`` calls it once per leased prompt)."""

from __future__ import annotations

import numpy as np

from dapo_async.engines.base import Completion
from dapo_async.protocol import FINISH_REASONS, Group


def make_group(
    generator_id: str,
    seq: int,
    prompt_id: int,
    prompt_tokens: list[int],
    completions: list[Completion],
    scored: list,
    version: int,
    gen_time_s: float = 0.0,
) -> Group:
    """One group; every token is tagged with the version of the weights that sampled it: the
    completion's own per-token versions (streaming engines) or ``version``."""
    lens = np.array([len(c.tokens) for c in completions], dtype=np.int32)
    tokens = (
        np.concatenate([c.tokens for c in completions]).astype(np.int32)
        if completions
        else np.zeros(0, np.int32)
    )
    logps = (
        np.concatenate([c.logprobs for c in completions]).astype(np.float32)
        if completions
        else np.zeros(0, np.float32)
    )
    return Group(
        generator_id=generator_id,
        seq=seq,
        prompt_id=prompt_id,
        prompt_tokens=np.asarray(prompt_tokens, dtype=np.int32),
        response_lens=lens,
        tokens=tokens,
        logprobs=np.minimum(logps, 0.0),
        versions=_versions(completions, version, tokens.shape[0]),
        rewards=np.array([s.reward for s in scored], dtype=np.float32),
        acc=np.array([s.acc for s in scored], dtype=np.float32),
        components=np.array([s.components for s in scored], dtype=np.float32).reshape(
            len(scored), -1
        ),
        finish=np.array([FINISH_REASONS[c.finish] for c in completions], dtype=np.uint8),
        gen_time_s=gen_time_s,
        sampled=_sampled(completions),
    )


def _sampled(completions: list[Completion]) -> np.ndarray | None:
    """The group's sampled mask: None when every token was sampled (single-turn)."""
    if all(c.sampled is None for c in completions):
        return None
    return np.concatenate(
        [np.ones(len(c.tokens), np.uint8) if c.sampled is None else c.sampled for c in completions]
    ).astype(np.uint8)


def _versions(completions: list[Completion], version: int, num_tokens: int) -> np.ndarray:
    if completions and all(c.versions is not None for c in completions):
        return np.concatenate([c.versions for c in completions]).astype(np.int32)
    return np.full(num_tokens, version, dtype=np.int32)
