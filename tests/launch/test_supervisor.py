"""The restart policy: backoff doubles and is capped; the rate limit forgets old restarts. The
watch loop: an evaluator that ends before the learner is not restarted."""

import sys

from dapo_async.config import load_config
from dapo_async.launch.supervisor import BACKOFF_MAX_S, RestartPolicy, Role, Supervisor


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


def test_an_evaluator_that_exits_0_before_the_learner_is_done_not_dead(tmp_path):
    """The evaluator saw the learner's last step and exited 0 while the learner was still
    writing its files: the watch loop restarted it, and the restarted one waited 5 minutes for
    work (a CI run of `bench ablation`: one arm took 5 min instead of 10 s)."""

    def role(name, code):
        return Role(name, [sys.executable, "-c", code], tmp_path / f"{name}.log", {}, True)

    sleeper = "import time; time.sleep(2.0)"
    buffer, learner = role("buffer", "import time; time.sleep(30)"), role("learner", sleeper)
    evaluator = role("evaluator", "pass")  # done at once, exit 0
    sup = Supervisor(load_config(None, []), tmp_path, buffer, learner, [], extras=[evaluator])
    try:
        for r in (buffer, learner, evaluator):
            r.start()
        sup.watch()  # until the learner exits 0
        assert evaluator.restarts == 0 and evaluator.restart_at is None
        sup.drain(timeout_s=10.0)  # nothing left to wait for
        assert evaluator.restarts == 0
    finally:
        for r in (buffer, learner, evaluator):
            r.kill_group()
