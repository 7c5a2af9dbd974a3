"""Fault injection on real runs (tiny model, every role a real process): each role SIGKILLed
mid-run comes back by itself and the run finishes with every step trained once, no group twice,
and the buffer's books balancing."""

import pytest
from faults import (
    check_accounting,
    finish,
    kill_role,
    learner_steps,
    start_run,
    wait_for,
)

NUM_STEPS = 10


@pytest.mark.slow
@pytest.mark.parametrize("victims", [("buffer",), ("learner",), ("buffer", "learner")])
def test_killed_role_comes_back_and_the_run_finishes(victims, tiny_model, tmp_path, repo, cli_env):
    run = tmp_path / "run"
    proc = start_run(repo, cli_env, tiny_model, run, f"learner.num_steps={NUM_STEPS}")
    # after the step-3 checkpoint and a step more, so the learner has work to redo
    wait_for(lambda: learner_steps(run) >= 5, 300, "5 learner steps", proc)
    for role in victims:
        assert kill_role(proc, role) == 1
    summary = finish(proc)
    assert summary["steps"] == NUM_STEPS
    for role in victims:
        assert f"[train] {role} exited with -9; restarting" in summary["stderr"]
    if "learner" in victims:
        log = (run / "logs" / "learner.log").read_text()
        assert "resumed from" in log and "published the resumed weights" in log
    if "buffer" in victims:
        assert "recovered buffer state" in (run / "logs" / "buffer.log").read_text()
    check_accounting(run, NUM_STEPS)


@pytest.mark.slow
def test_generators_killed_again_and_again(tiny_model, tmp_path, repo, cli_env):
    """Three SIGKILLs of the generators at different steps: each comes back (backoff), the run
    finishes, nothing is trained twice."""
    run = tmp_path / "run"
    proc = start_run(
        repo, cli_env, tiny_model, run, f"learner.num_steps={NUM_STEPS}",
        "generator.num_generators=2",
    )  # fmt: skip
    for after in (2, 4, 6):
        wait_for(lambda a=after: learner_steps(run) >= a, 300, f"{after} steps", proc)
        wait_for(lambda: kill_role(proc, "generator") >= 1, 60, "a live generator", proc)
    summary = finish(proc)
    assert summary["steps"] == NUM_STEPS and summary["generator_restarts"] >= 3
    check_accounting(run, NUM_STEPS)


def test_a_role_that_cannot_start_is_not_restarted(tiny_model, tmp_path, repo, cli_env):
    """An error exit right after starting is a configuration or code error: the run stops with
    that role's log instead of restarting it in a loop."""
    run = tmp_path / "run"
    proc = start_run(
        repo, cli_env, tiny_model, run, "learner.num_steps=3", "reward.fn=no_such_module:fn"
    )
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 1
    assert "not restarting a role that cannot start" in err and "restarting in" not in err


@pytest.mark.slow
def test_no_listener_outside_loopback_during_a_default_run(tiny_model, tmp_path, repo, cli_env):
    """A listener audit of every process of a default run (buffer, learner with its weight-sync
    store and gloo pairs, generators, reward workers), sampled while it trains."""
    import psutil

    run = tmp_path / "run"
    proc = start_run(repo, cli_env, tiny_model, run, "learner.num_steps=6")
    seen: set[tuple[str, int]] = set()
    try:
        wait_for(lambda: learner_steps(run) >= 2, 300, "2 learner steps", proc)
        for _ in range(3):
            for p in psutil.Process(proc.pid).children(recursive=True):
                try:
                    conns = p.net_connections(kind="inet")
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
                seen |= {c.laddr[:2] for c in conns if c.status == psutil.CONN_LISTEN}
    finally:
        summary = finish(proc)
    assert seen, "no listener found: the audit looked at the wrong processes"
    public = {a for a in seen if a[0] not in ("127.0.0.1", "::1")}
    assert not public, f"listening beyond loopback: {public}"
    assert summary["steps"] == 6
