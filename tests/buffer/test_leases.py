"""Leases bounded whatever a generator does (issue 35): a cap on what one generator holds, a
deadline from the grant that heartbeats do not extend, a watchdog that re-issues what the
waiting learner needs; and a refused group leaves its effect, not its arrays, in the
write-ahead log."""

import time

from helpers import group

from dapo_async import protocol
from dapo_async.buffer.checks import GroupLimits
from dapo_async.buffer.records import Lease, holds_step
from dapo_async.buffer.service import BufferService
from dapo_async.buffer.state import BufferState
from dapo_async.config import BufferConfig, load_config
from dapo_async.data.tasks import PromptRecord


def state(**kw) -> BufferState:
    cfg = BufferConfig(**{"groups_per_step": 4, "max_staleness": 1, **kw})
    s = BufferState(cfg, num_prompts=100, seed=0, component_names=["correct", "overlong"])
    s.hello("g")
    s.hello("hoarder")
    return s


def test_one_generator_holds_at_most_its_cap():
    s = state(max_leases_per_generator=3)
    assert len(s.grant("hoarder", 10)) == 3
    assert s.grant("hoarder", 10) == []
    mine = s.grant("g", 2)
    assert len(mine) == 2  # the others still get prompts
    s.ingest(group("g", 0, mine[0].lease_id))
    assert len(s.grant("g", 5)) == 2  # 3 − the 1 still held
    # derived at load: twice what a generator keeps in flight
    cfg = load_config(None, ["generator.prompts_per_batch=8"])
    assert cfg.buffer.max_leases_per_generator == 16
    cfg = load_config(None, ["generator.max_inflight=256", "generator.responses_per_prompt=8"])
    assert cfg.buffer.max_leases_per_generator == 64


def test_a_hoarded_lease_is_reissued_at_its_deadline_though_its_holder_heartbeats():
    s = state(lease_deadline_s=10.0, lease_timeout_s=5.0)
    held = s.grant("hoarder", 3, now=0.0)
    for t in (4.0, 8.0):
        s.heartbeat("hoarder", now=t)
        assert s.expire_leases(now=t) == []
    s.heartbeat("hoarder", now=11.0)  # alive, but 11 s past the grant
    lost = s.expire_leases(now=11.0)
    assert {ls.lease_id for ls in lost} == {ls.lease_id for ls in held}
    assert s.counters.lease_overdue == 3 and s.stats()["buffer/lease_overdue"] == 3.0
    again = s.grant("g", 3, now=11.0)
    assert sorted(ls.prompt_index for ls in again) == sorted(ls.prompt_index for ls in held)
    # the hoarder's late groups are refused and cannot take the re-issued prompts back
    assert s.ingest(group("hoarder", 0, held[0].lease_id)) == "rejected:unknown_lease"


def test_the_watchdog_reissues_what_the_waiting_learner_needs():
    """The learner waits for step 0 (pacing: a lease due then is outstanding and its holder
    heartbeats). Past stall_reissue_s the held leases go to another generator."""
    s = state(groups_per_step=2, lease_deadline_s=0.0, stall_reissue_s=60.0)
    t0 = time.monotonic()
    (stuck,) = s.grant("hoarder", 1, now=t0)
    (done,) = s.grant("g", 1, now=t0)
    assert s.ingest(group("g", 0, done.lease_id)) == "stored"
    assert s.batch(0, 0, 1) is None  # waits for the hoarder's group
    s.heartbeat("hoarder", now=t0 + 30)
    assert s.expire_leases(now=t0 + 30) == []  # not yet
    s.heartbeat("hoarder", now=t0 + 61)
    assert [ls.lease_id for ls in s.expire_leases(now=t0 + 61)] == [stuck.lease_id]
    assert s.counters.lease_stalled == 1
    (again,) = s.grant("g", 1)
    assert again.prompt_index == stuck.prompt_index
    assert s.ingest(group("g", 1, again.lease_id)) == "stored"
    assert s.batch(0, 0, 1) is not None
    assert s.waiting_since == {}


def test_a_hoarder_whose_leases_were_taken_back_holds_no_step_and_one_lease():
    """Once the watchdog took a hoarder's leases back it is on probation: it holds one lease
    at a time and pacing waits for none of them (it stalls the run once, not at every step).
    A group it stores ends the probation."""
    s = state(groups_per_step=2, lease_deadline_s=0.0, stall_reissue_s=60.0)
    t0 = time.monotonic()
    s.grant("hoarder", 3, now=t0)
    assert s.batch(0, 0, 1) is None  # no groups: the learner waits
    s.heartbeat("hoarder", now=t0 + 61)
    assert len(s.expire_leases(now=t0 + 61)) == 3 and "hoarder" in s.on_probation
    (held,) = s.grant("hoarder", 5)  # one at a time
    assert s.grant("hoarder", 5) == []
    alive = {"hoarder": t0 + 61, "g": t0 + 61}
    due = [Lease(1, 0, "hoarder", t0, deadline=1)]
    assert not holds_step(due, 1, alive, s.on_probation, t0 + 62)
    assert holds_step(due, 1, alive, {}, t0 + 62)  # an honest holder's lease holds its step
    assert s.ingest(group("hoarder", 0, held.lease_id)) == "stored"
    assert "hoarder" not in s.on_probation and len(s.grant("hoarder", 5)) > 1


def test_a_generator_whose_group_was_refused_on_its_own_lease_is_on_probation():
    s = state(groups_per_step=2)
    (mine,) = s.grant("g", 1)
    assert s.reject(group("g", 0, mine.lease_id), "group_size") == "rejected:group_size"
    assert "g" in s.on_probation and len(s.grant("g", 5)) == 1
    (theirs,) = s.grant("hoarder", 1)  # naming another's lease changes nothing of theirs
    assert s.reject(group("g", 1, theirs.lease_id), "group_size") == "rejected:group_size"
    assert "hoarder" not in s.on_probation and theirs.lease_id in s.leases


def _service(wal_path) -> BufferService:
    records = [PromptRecord(i, [{"role": "user", "content": str(i)}], "0", "t") for i in range(8)]
    return BufferService(
        BufferConfig(groups_per_step=2, lease_timeout_s=30.0),
        0,
        GroupLimits(50, 8, responses_per_group=2),
        records,
        [[1, 2]] * 8,
        None,
        wal_path=wal_path,
    )


def test_a_refused_group_leaves_its_effect_not_its_arrays_in_the_wal(tmp_path):
    wal = tmp_path / "buffer.wal"
    svc = _service(wal)
    svc.handle(protocol.Hello("g", 1, "hf"))
    grant = svc.handle(protocol.LeaseRequest("g", 2))
    bad_id, good_id = grant.prompt_ids
    big = group("g", 0, bad_id, acc=[1, 0] * 1024, tokens_per_response=8)  # 2,048 responses
    good = group("g", 1, good_id)
    names = svc.state.component_names or ["correct", "overlong"]
    for g, want in ((big, "rejected:group_size"), (good, "stored")):
        batch = protocol.GroupBatch.from_groups([g], names)
        assert svc.handle(protocol.ScoredGroups(batch=batch)).statuses == [want]
    svc.wal.flush()
    assert wal.stat().st_size < big.tokens.nbytes // 4  # the 2,048 responses are not in it
    before = (svc.state.snapshot(), svc.state.counters.rejected["group_size"])
    svc.close()
    again = _service(wal)  # a restarted buffer replays the log to the same state
    assert (again.state.snapshot(), again.state.counters.rejected["group_size"]) == before
    assert bad_id not in again.state.leases and len(again.state.groups) == 1


def test_the_wal_is_compacted_by_size_without_checkpoints(tmp_path, monkeypatch):
    """Between checkpoints the log used to grow with every event (a peer sending thousands of
    refused groups, lease traffic); past twice its compacted size it is rewritten as a
    snapshot, and replays to the same state."""
    from dapo_async.buffer import wal as wal_mod

    monkeypatch.setattr(wal_mod, "COMPACT_MIN_BYTES", 4096)
    path = tmp_path / "buffer.wal"
    svc = _service(path)
    svc.handle(protocol.Hello("g", 1, "hf"))
    names = ["correct", "overlong"]
    (lease_id,) = svc.handle(protocol.LeaseRequest("g", 1)).prompt_ids
    batch = protocol.GroupBatch.from_groups([group("g", 0, lease_id)], names)
    assert svc.handle(protocol.ScoredGroups(batch=batch)).statuses == ["stored"]
    sizes = []
    for i in range(1, 1001):  # refused: a lease nobody holds
        batch = protocol.GroupBatch.from_groups([group("g", i, 10**6 + i)], names)
        assert svc.handle(protocol.ScoredGroups(batch=batch)).statuses == ["rejected:unknown_lease"]
        if i % 50 == 0:
            svc.wal.flush()
            svc.maybe_compact()
            sizes.append(path.stat().st_size)
    assert max(sizes) < 3 * 4096  # ~60 kB of events uncompacted
    snap = svc.state.snapshot()
    svc.close()
    again = _service(path)
    assert again.state.snapshot() == snap
    assert again.state.counters.rejected["unknown_lease"] == 1000


def test_a_grant_says_the_staleness_bound_and_the_learners_version(tmp_path):
    """What a stream-mode generator needs to restart a request that can no longer be trained
    (generator/stream.py): the buffer's max_staleness and the learner's version."""
    svc = _service(tmp_path / "buffer.wal")
    svc.handle(protocol.Hello("g", 1, "hf"))
    svc.handle(protocol.BatchRequest(0, 1, 3))  # the learner asks for step 3
    grant = svc.handle(protocol.LeaseRequest("g", 1))
    assert grant.prompt_ids and grant.version == 3
    assert grant.max_staleness == svc.state.cfg.max_staleness == 1
    assert grant.min_version == 2
    svc.close()
