"""Weighted data mixtures (``data.sources``): each draw picks a source in proportion to its
weight, deterministic for a seed, resumable exactly from its state, each source walking its own
shuffled epochs; the buffer leases from the mixture."""

import json

import pytest

from dapo_async.buffer.state import BufferState
from dapo_async.config import load_config
from dapo_async.data.cursor import MixtureCursor, cursor_from_state


def test_draws_follow_the_weights_and_cover_each_source():
    c = MixtureCursor([100, 50, 10], [0.6, 0.3, 0.1], seed=4)
    picks = [c.next() for _ in range(20_000)]
    shares = [sum(c.source_of(i) == s for i in picks) / len(picks) for s in range(3)]
    assert shares == pytest.approx([0.6, 0.3, 0.1], abs=0.02)
    # each source's prompts come in its own epochs: the first 10 of source 2 are a permutation
    small = [i - 150 for i in picks if i >= 150][:10]
    assert sorted(small) == list(range(10))


def test_mixture_is_deterministic_and_resumes_exactly():
    a = MixtureCursor([7, 5], [1.0, 3.0], seed=1)
    b = MixtureCursor([7, 5], [1.0, 3.0], seed=1)
    assert [a.next() for _ in range(30)] == [b.next() for _ in range(30)]
    a.requeue(3)
    state = json.loads(json.dumps(a.state()))
    resumed = cursor_from_state(state)
    assert [a.next() for _ in range(40)] == [resumed.next() for _ in range(40)]
    with pytest.raises(ValueError, match="weights"):
        MixtureCursor([3, 3], [1.0, 0.0])


def test_buffer_leases_from_the_mixture():
    cfg = load_config(None, ["buffer.max_leases_per_generator=64"])  # one generator draws 32
    state = BufferState(cfg.buffer, 40, seed=0, mixture=([30, 10], [0.25, 0.75]))
    leases = state.grant("g", 16, weights_version=0) + state.grant("g", 16, weights_version=0)
    from_small = sum(ls.prompt_index >= 30 for ls in leases)
    assert 16 <= from_small <= 32  # ~3/4 of 32 come from the 10-prompt source


def test_sources_config_is_checked():
    cfg = load_config(None, ["data.sources={tiny:chain: 3, tiny:arith: 1}"])
    assert cfg.data.sources == {"tiny:chain": 3, "tiny:arith": 1}
    with pytest.raises(ValueError, match=r"data\.sources"):
        load_config(None, ["data.sources={tiny:chain: 0}"])
