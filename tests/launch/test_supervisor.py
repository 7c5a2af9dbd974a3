"""The restart policy: backoff doubles and is capped; the rate limit forgets old restarts."""

from dapo_async.launch.supervisor import BACKOFF_MAX_S, RestartPolicy


def test_backoff_doubles_up_to_the_cap():
    policy = RestartPolicy(max_restarts=20, window_s=1e9)
    delays = [policy.next_delay(float(t)) for t in range(8)]
    assert delays[:4] == [1.0, 2.0, 4.0, 8.0]
    assert max(delays) == BACKOFF_MAX_S and delays[-1] == BACKOFF_MAX_S


def test_rate_limit_gives_up_within_the_window_and_forgets_old_restarts():
    policy = RestartPolicy(max_restarts=3, window_s=100.0)
    assert all(policy.next_delay(t) is not None for t in (0.0, 10.0, 20.0))
    assert policy.next_delay(30.0) is None  # a fourth death within 100 s
    # long after, a crash is a new incident: allowed again, with the shortest backoff
    assert policy.next_delay(500.0) == 1.0
