import time

import pytest

from dapo_async.reward.compose import RewardError
from dapo_async.reward.pool import PIPELINE_BYTES, PIPELINE_DEPTH, RewardPool


def test_builtin_verifier_in_workers():
    with RewardPool("dapo_math", num_workers=2, timeout_s=5) as pool:
        res = pool.score_batch([("Answer: 4", "4"), ("Answer: 5", "4"), ("nothing", "4")])
    assert [r["acc"] for r in res] == [1.0, 0.0, 0.0]
    assert [r["score"] for r in res] == [1.0, -1.0, -1.0]


def test_hung_verifier_times_out_and_pool_recovers():
    with RewardPool("bad_verifiers:hang", num_workers=1, timeout_s=1.0) as pool:
        t0 = time.monotonic()
        res = pool.score_batch([("a", "a"), ("hang", "a"), ("b", "b")])
        assert time.monotonic() - t0 < 20
        assert res[0]["acc"] == 1.0 and res[2]["acc"] == 1.0
        assert res[1]["tag"] == "timeout" and res[1]["score"] == -1.0
        assert pool.score_batch([("c", "c")])[0]["acc"] == 1.0
        assert pool.counters["timeout"] == 1


def test_items_queued_behind_a_hung_one_are_sent_again_and_scored():
    """Each worker is sent its share of the batch ahead of its replies: what was queued behind
    a hung item goes to the replacement worker; responses larger than the pipelining byte cap
    are sent one at a time, never blocking on a busy worker."""
    big = "x" * (PIPELINE_BYTES // 2)
    items = [("hang", "a"), ("a", "a"), (big, big), (big, "b"), ("b", "b"), (big, big)]
    with RewardPool("bad_verifiers:hang", num_workers=2, timeout_s=1.0) as pool:
        res = pool.score_batch(items)
        assert [r["tag"] for r in res] == ["timeout"] + ["ok"] * 5
        assert [r["score"] for r in res] == [-1.0, 1.0, 1.0, -1.0, 1.0, 1.0]
        assert pool.counters["timeout"] == 1
        many = [(str(i), str(i % 2)) for i in range(3 * PIPELINE_DEPTH)]  # deeper than a queue
        assert [r["score"] for r in pool.score_batch(many)] == [
            1.0 if i < 2 else -1.0 for i in range(3 * PIPELINE_DEPTH)
        ]


def test_crashing_verifier_is_tagged_and_replaced():
    with RewardPool("bad_verifiers:crash", num_workers=2, timeout_s=5) as pool:
        res = pool.score_batch([("crash", "x"), ("y", "y"), ("crash", "x"), ("z", "z")])
        assert [r["tag"] for r in res] == ["crash", "ok", "crash", "ok"]
        assert pool.score_batch([("q", "q")])[0]["acc"] == 1.0


def test_raising_and_non_finite_verifiers():
    with RewardPool("bad_verifiers:raises", num_workers=1, timeout_s=5) as pool:
        res = pool.score_batch([("raise", ""), ("ok", "")])
        assert res[0]["tag"] == "error" and "verifier bug" in res[0]["error"]
        assert res[1]["score"] == 1.0
    with RewardPool("bad_verifiers:nan", num_workers=1, timeout_s=5) as pool:
        res = pool.score_batch([("nan", ""), ("ok", "")])
        assert res[0]["tag"] == "non_finite" and res[0]["score"] == -1.0
        assert res[1]["score"] == 1.0


def test_unknown_function_fails_fast():
    with pytest.raises(RewardError, match="unknown reward function"):
        RewardPool("no_such_fn")
    with pytest.raises(RewardError, match="cannot import"):
        RewardPool("no_such_module:fn")
