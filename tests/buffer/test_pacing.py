"""Pacing: a group still being generated when the step it is due at is assembled is waited for,
not dropped as stale; with out-of-order (long-tail) completion nothing is ever dropped for being
slow, and the learner still advances."""

import random

import pytest
from helpers import group

from dapo_async.buffer.state import BufferState
from dapo_async.config import BufferConfig


def state(**kw):
    cfg = BufferConfig(**{"groups_per_step": 2, "max_staleness": 1, **kw})
    s = BufferState(cfg, num_prompts=1000, seed=0, component_names=["correct", "overlong"])
    s.hello("g")
    return s


def test_a_slow_group_is_waited_for_and_trained_in_time():
    s = state()
    a, b, c, d = s.grant("g", 4, weights_version=0)
    assert {ls.deadline for ls in (a, b, c, d)} == {1}
    for seq, ls in enumerate((b, c, d)):
        s.ingest(group("g", seq, ls.lease_id, version=0))
    assert s.batch(0, 0, 1) is not None  # a is not due at step 0
    assert s.batch(1, 0, 1) is None  # a is due at step 1 and still generating: wait
    assert s.counters.paced_waits == 1
    s.ingest(group("g", 9, a.lease_id, version=0))
    batch, _, _ = s.batch(1, 0, 1)
    assert ("g", 9) in batch.group_ids()
    assert s.counters.dropped["stale"] == 0


def test_no_step_waits_for_a_spare_generators_lease():
    """A spare generator decodes only while the learner waits: a step that waited for its
    lease would wait for itself. Its late group is dropped as stale like anyone's."""
    s = state()
    s.hello("spare", spare=True)
    (slow,) = s.grant("spare", 1, weights_version=0)
    ours = s.grant("g", 3, weights_version=0)
    assert {ls.deadline for ls in (slow, *ours)} == {1}
    for seq, ls in enumerate(ours):
        s.ingest(group("g", seq, ls.lease_id, version=0))
    assert s.batch(0, 0, 1) is not None
    assert s.batch(1, 0, 1) is None  # one group ready, two needed
    (more,) = s.grant("g", 1, weights_version=1)
    s.ingest(group("g", 3, more.lease_id, version=1))
    assert s.batch(1, 0, 1) is not None  # the spare's lease was due at step 1: not waited for
    assert s.counters.paced_waits == 0
    s.ingest(group("spare", 0, slow.lease_id, version=0))  # late
    s.batch(2, 0, 1)  # step 2 trains nothing older than version 1
    assert s.counters.dropped["stale"] == 1 and ("spare", 0) not in s.groups


def test_a_generator_claiming_future_weights_is_not_believed():
    s = state(max_staleness=2)
    (ls,) = s.grant("g", 1, weights_version=10**6)
    assert ls.deadline == s.version + 2
    (old,) = s.grant("g", 1, weights_version=0)
    assert old.deadline == 2


@pytest.mark.parametrize("max_staleness", [0, 1, 2])
def test_long_tail_completion_never_drops_a_slow_group(max_staleness):
    """A simulated run: generators keep 12 prompts in flight, each finishing after 1 to 30 ticks
    (heavy tail), in any order, with the weights of the moment they start; the learner asks for
    a step each tick. Every produced group is trained within the bound, none dropped as stale,
    and the learner reaches step 40."""
    rng = random.Random(max_staleness)
    s = state(groups_per_step=4, max_staleness=max_staleness)
    inflight: list[tuple[int, int, int]] = []  # (finish tick, lease id, version at start)
    step, seq, weights = 0, 0, 0
    for tick in range(20_000):
        free = 12 - len(inflight)
        for ls in s.grant("g", free, weights_version=weights) if free > 0 else []:
            duration = 1 if rng.random() < 0.7 else rng.randint(2, 30)
            inflight.append((tick + duration, ls.lease_id, weights))
        for item in [x for x in inflight if x[0] <= tick]:
            inflight.remove(item)
            s.ingest(group("g", seq, item[1], version=item[2]))
            seq += 1
        got = s.batch(step, 0, 1)
        if got is not None:
            batch, _, _ = got
            for g in (batch.group(i) for i in range(len(batch))):
                assert step - int(g.versions.min()) <= max_staleness
            step += 1
            weights = step  # the new weights reach the generator at once
            if step == 40:
                break
    assert step == 40, f"the learner stalled at step {step}"
    assert s.counters.dropped["stale"] == 0


def test_pacing_does_not_wait_for_a_silent_generator():
    """A generator killed mid-generation stops heartbeating: the step goes on without its
    prompt (which is leased again after buffer.lease_timeout_s)."""
    import time

    s = state()
    a, b, c, d = s.grant("g", 4, now=time.monotonic() - 100)  # silent for 100 s since
    for seq, ls in enumerate((b, c, d)):
        s.ingest(group("g", seq, ls.lease_id, version=0))
    s.generators["g"] = time.monotonic() - 100  # ingest counts as a sign of life
    assert s.batch(0, 0, 1) is not None
    assert s.batch(1, 0, 1) is None  # not enough groups, but not paced
    assert s.counters.paced_waits == 0
