"""Admission that expects dynamic sampling: an outstanding lease counts as the recent share of
groups that qualified (``buffer.admit_expected``), a surplus due at one step is chosen at
random rather than by arrival, and a replayed log grants exactly what was granted."""

import random
from collections import deque

import pytest
from helpers import group
from test_leases import _service

from dapo_async import protocol
from dapo_async.buffer.records import outstanding_allowed, shuffle_due
from dapo_async.buffer.state import BufferState
from dapo_async.config import BufferConfig

SOLVED, MIXED = (1, 1), (1, 0)  # an all-correct group (filtered) and one that qualifies


def state(**kw) -> BufferState:
    cfg = BufferConfig(**{"groups_per_step": 4, "max_staleness": 1, **kw})
    s = BufferState(cfg, num_prompts=1000, seed=0, component_names=["correct", "overlong"])
    s.hello("g")
    return s


def test_leases_count_at_the_recent_qualified_share_with_a_prior():
    assert outstanding_allowed(10, []) == 10  # no history: every lease counts one
    recent = [(1.0, 2, False)] * 3 + [(1.0, 2, True)]
    assert outstanding_allowed(10, recent) == 25  # each counts (1 + 1) / (4 + 1)
    assert outstanding_allowed(3, [(2.0, 2, True)] * 4) == 3  # none filtered: as before
    assert outstanding_allowed(0, recent) == 0 and outstanding_allowed(-2, recent) == -2


@pytest.mark.parametrize("expect", [True, False])
def test_filtered_groups_let_more_prompts_out(expect):
    """Budget (0 + 1 + 1) × 4 = 8 groups. One of four received groups qualified: with
    admit_expected a lease counts 0.4, so 17 may be outstanding (1 + 0.4 × 17 ≤ 8); without,
    each counts one and 7 may."""
    s = state(admit_expected=expect)
    for i, (ls, acc) in enumerate(zip(s.grant("g", 4), (SOLVED, SOLVED, SOLVED, MIXED))):
        assert s.ingest(group("g", i, ls.lease_id, acc=acc)) == "stored"
    assert s.counters.qualified == 1 and s.counters.dropped["filtered"] == 3
    assert len(s.grant("g", 100)) == (17 if expect else 7)
    assert s.admissible() == 0


def test_a_surplus_due_at_a_step_is_chosen_at_random_not_by_arrival():
    """Three groups due at step 1 (oldest token 0, max_staleness 1), two slots: which two
    train varies with the step's seed, so the last to arrive (the longest response) is kept
    about two times in three, not never; a replay of the same step picks the same."""
    kept_last = 0
    for step in range(1, 301):
        ready = deque(["a", "b", "slow", "next"])
        oldest = {"a": step - 1, "b": step - 1, "slow": step - 1, "next": step}
        shuffle_due(ready, oldest, step - 1, 2, step)
        assert ready[3] == "next" and sorted(list(ready)[:3]) == ["a", "b", "slow"]
        kept_last += "slow" in list(ready)[:2]
        again = deque(["a", "b", "slow", "next"])
        shuffle_due(again, oldest, step - 1, 2, step)
        assert again == ready
    assert 150 < kept_last < 250
    ready = deque(["a", "b", "slow"])  # no surplus: arrival order stays
    shuffle_due(ready, {"a": 0, "b": 0, "slow": 0}, 0, 3, 1)
    assert list(ready) == ["a", "b", "slow"]


def _simulate(admit_expected: bool, seed: int = 0):
    """Generators keep 24 prompts in flight, each finishing after 1 to 30 ticks (heavy tail),
    70% of them all-correct (dropped by dynamic sampling); the learner asks for a step each
    tick. Returns (ticks to step 30, stale drops, mean duration of trained and of qualified
    groups)."""
    rng = random.Random(seed)
    s = state(admit_expected=admit_expected)
    inflight: list[tuple[int, int, int, int]] = []  # (finish tick, lease, version, duration)
    step, seq, weights, dur_of, trained, qualified = 0, 0, 0, {}, [], []
    for tick in range(50_000):
        free = 24 - len(inflight)
        for ls in s.grant("g", free, weights_version=weights) if free > 0 else []:
            duration = 1 if rng.random() < 0.6 else rng.randint(2, 30)
            inflight.append((tick + duration, ls.lease_id, weights, duration))
        for item in [x for x in inflight if x[0] <= tick]:
            inflight.remove(item)
            acc = SOLVED if rng.random() < 0.7 else MIXED
            s.ingest(group("g", seq, item[1], acc=acc, version=item[2]))
            dur_of[("g", seq)] = item[3]
            if acc == MIXED:
                qualified.append(item[3])
            seq += 1
        got = s.batch(step, 0, 1)
        if got is not None:
            batch = got[0]
            for g in (batch.group(i) for i in range(len(batch))):
                assert step - int(g.versions.min()) <= 1  # the bound holds
                trained.append(dur_of[g.group_id])
            step += 1
            weights = step
            if step == 30:
                break
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    return tick, s.counters.dropped["stale"], mean(trained), mean(qualified), len(trained)


def test_expected_admission_reaches_the_step_sooner_within_the_bound():
    """With 70% of groups filtered, counting leases at the qualified share reaches step 30 in
    fewer ticks; the staleness bound holds in both (asserted per trained group)."""
    ticks_on, stale_on, trained_on, qualified_on, n_on = _simulate(True)
    ticks_off, stale_off, _, _, _ = _simulate(False)
    assert stale_off == 0 and n_on == 30 * 4
    assert ticks_on < ticks_off, (ticks_on, ticks_off)
    print(
        f"ticks to step 30: {ticks_on} expected-admission, {ticks_off} counting each lease; "
        f"stale drops {stale_on}; mean duration trained {trained_on:.2f}, qualified "
        f"{qualified_on:.2f}"
    )


def test_a_replayed_log_grants_what_was_granted(tmp_path):
    """After a compaction the snapshot does not hold the recent groups admission looks at, so
    a replay that re-ran admission could grant a different count: the log holds the count
    granted ("lease" events) and the restarted buffer reaches the same state."""
    wal = tmp_path / "buffer.wal"
    svc = _service(wal)
    svc.handle(protocol.Hello("g", 1, "hf"))
    names = ["correct", "overlong"]

    def send(seq, lease_id, acc):
        batch = protocol.GroupBatch.from_groups([group("g", seq, lease_id, acc=acc)], names)
        assert svc.handle(protocol.ScoredGroups(batch=batch)).statuses == ["stored"]

    a, b = svc.handle(protocol.LeaseRequest("g", 2)).prompt_ids
    send(0, a, SOLVED)
    send(1, b, SOLVED)
    svc.compact()  # the snapshot: two filtered groups received, none kept
    granted = svc.handle(protocol.LeaseRequest("g", 8)).prompt_ids
    assert len(granted) == 8  # each counts 1/3: a budget of 4 allows 12
    svc.wal.flush()
    snap = svc.state.snapshot()
    svc.close()
    again = _service(wal)
    assert again.state.snapshot() == snap
    assert sorted(again.state.leases) == sorted(granted)


def test_a_log_written_before_lease_events_still_replays(tmp_path):
    """Logs written before "lease" events hold "grant" events with the count asked for: they
    replay through admission, as they were granted."""
    wal = tmp_path / "buffer.wal"
    svc = _service(wal)
    svc.handle(protocol.Hello("g", 1, "hf"))
    granted = svc.state.grant("g", 3, weights_version=0)  # what an older buffer did and logged
    svc.wal.event("grant", ["g", 3, 0])
    svc.wal.flush()
    snap = svc.state.snapshot()
    svc.close()
    again = _service(wal)
    assert again.state.snapshot() == snap
    assert sorted(again.state.leases) == sorted(ls.lease_id for ls in granted)
