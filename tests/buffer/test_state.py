import pytest
from helpers import group

from dapo_async.buffer.state import BufferState, balance_shards
from dapo_async.config import BufferConfig


def state(**kw):
    cfg = BufferConfig(**{"groups_per_step": 2, "max_staleness": 1, **kw})
    s = BufferState(cfg, num_prompts=100, seed=0, component_names=["correct", "overlong"])
    s.hello("g")
    return s


def test_admission_rule():
    s = state(groups_per_step=2, max_staleness=1)
    # v = 0: (0 + 1 + 1) * 2 = 4 groups may be leased or accepted
    leases = s.grant("g", 10)
    assert len(leases) == 4 and s.admissible() == 0
    assert s.grant("g", 1) == []
    # accepting does not free capacity (accepted counts too) ...
    for i, ls in enumerate(leases):
        assert s.ingest(group("g", i, ls.lease_id)) == "stored"
    assert s.admissible() == 0
    # ... a new learner version does
    assert s.batch(0, 0, 1) is not None
    s.advance(1, 0, 1)
    assert s.admissible() == 2


def test_synchronous_when_max_staleness_zero():
    s = state(groups_per_step=2, max_staleness=0)
    assert len(s.grant("g", 5)) == 2


def test_groups_dropped_as_stale_free_admission():
    """Synchronous mode: a group made by the previous weights is dropped at assembly, and its
    slot must be leased again (counting it as qualified starved the learner forever)."""
    s = state(groups_per_step=2, max_staleness=0)
    a, b = s.grant("g", 2)
    s.ingest(group("g", 0, a.lease_id))
    s.ingest(group("g", 1, b.lease_id))
    assert s.batch(0, 0, 1) is not None
    s.advance(1, 0, 1)
    c, d = s.grant("g", 2)
    s.ingest(group("g", 2, c.lease_id, version=0))  # generated before weights v1 arrived
    s.ingest(group("g", 3, d.lease_id, version=1))
    assert s.batch(1, 0, 1) is None  # one fresh group only: the stale one is dropped
    assert s.counters.dropped["stale"] == 1
    (e,) = s.grant("g", 2)  # exactly one replacement may be leased
    s.ingest(group("g", 4, e.lease_id, version=1))
    assert s.batch(1, 0, 1) is not None


def test_oldest_allowed_version_follows_the_learner_and_the_bound():
    """Leases carry the oldest version whose tokens may still be trained: v - max_staleness,
    never below 0, moving up as the learner asks for later steps."""
    s = state(groups_per_step=2, max_staleness=2)
    assert s.oldest_allowed_version() == 0
    s.advance(1, 0, 1)
    assert s.oldest_allowed_version() == 0  # 1 - 2 < 0
    s.advance(5, 0, 1)
    assert s.oldest_allowed_version() == 3
    assert state(groups_per_step=2, max_staleness=0).oldest_allowed_version() == 0
    sync = state(groups_per_step=2, max_staleness=0)
    sync.advance(4, 0, 1)
    assert sync.oldest_allowed_version() == 4


def test_dedupe_unknown_lease_and_unknown_generator():
    s = state()
    (ls,) = s.grant("g", 1)
    assert s.ingest(group("g", 0, ls.lease_id)) == "stored"
    assert s.ingest(group("g", 0, ls.lease_id)) == "duplicate"
    assert s.ingest(group("g", 1, 999)) == "rejected:unknown_lease"
    assert s.ingest(group("stranger", 0, 0)) == "retry:hello"
    assert s.counters.rejected == {"duplicate": 1, "unknown_lease": 1, "unknown_generator": 1}
    assert s.counters.accepted == 1


def test_dynamic_sampling_filter_and_band_pass():
    s = state(groups_per_step=8)
    leases = s.grant("g", 4)
    assert s.ingest(group("g", 0, leases[0].lease_id, acc=(1, 1))) == "stored"  # all correct
    assert s.ingest(group("g", 1, leases[1].lease_id, acc=(0, 0))) == "stored"  # all wrong
    s.ingest(group("g", 2, leases[2].lease_id, acc=(1, 0)))
    assert s.counters.dropped["filtered"] == 2 and len(s.ready) == 1
    b = state(groups_per_step=8, min_group_acc=0.6)
    leases = b.grant("g", 2)
    b.ingest(group("g", 0, leases[0].lease_id, acc=(1, 0, 0)))  # acc 1/3 < 0.6
    b.ingest(group("g", 1, leases[1].lease_id, acc=(1, 1, 0)))
    assert len(b.ready) == 1 and b.counters.dropped["filtered"] == 1
    off = state(groups_per_step=8, dynamic_sampling=False)
    (ls,) = off.grant("g", 1)
    off.ingest(group("g", 0, ls.lease_id, acc=(1, 1)))
    assert len(off.ready) == 1


def test_tokens_of_filtered_groups_are_counted_and_survive_a_snapshot():
    """The share of decoded tokens dynamic sampling threw away: buffer/filtered_token_share
    (and bench async's filtered_token_share); a snapshot written before tokens were counted
    still loads, with zero."""
    from dapo_async.buffer.counters import Counters, state_stats

    s = state(groups_per_step=8)
    a, b, c = s.grant("g", 3)
    s.ingest(group("g", 0, a.lease_id, acc=(1, 1), tokens_per_response=5))  # filtered: 10
    s.ingest(group("g", 1, b.lease_id, acc=(1, 0), tokens_per_response=3))  # kept: 6
    s.ingest(group("g", 2, c.lease_id, acc=(0, 0, 0), tokens_per_response=8))  # filtered: 24
    assert (s.counters.tokens_produced, s.counters.tokens_filtered) == (40, 34)
    stats = state_stats(s)
    assert stats["buffer/tokens_produced"] == 40.0 and stats["buffer/tokens_filtered"] == 34.0
    assert stats["buffer/filtered_token_share"] == pytest.approx(34 / 40)
    assert Counters.from_dict(s.counters.to_dict()) == s.counters
    old = s.counters.to_dict()
    del old["tokens_produced"], old["tokens_filtered"]
    assert Counters.from_dict(old).tokens_produced == 0
    assert "buffer/filtered_token_share" not in state_stats(state())  # nothing decoded yet


def test_staleness_eviction_at_assembly():
    s = state(groups_per_step=2, max_staleness=1, max_buffered_groups=100)
    s.version = 3  # pretend the learner is at step 3: capacity is large
    leases = s.grant("g", 3)
    s.ingest(group("g", 0, leases[0].lease_id, version=1))  # 3 - 1 > 1: stale
    s.ingest(group("g", 1, leases[1].lease_id, version=2))
    s.ingest(group("g", 2, leases[2].lease_id, version=3))
    batch, tokens, n = s.batch(3, 0, 1)
    assert n == 2 and s.counters.dropped["stale"] == 1
    assert sorted(g.seq for g in batch) == [1, 2]
    assert s.staleness_hist == {1: 6, 0: 6}


def test_idempotent_batches_and_shards():
    s = state(groups_per_step=4)
    leases = s.grant("g", 4)
    for i, ls in enumerate(leases):
        s.ingest(group("g", i, ls.lease_id, tokens_per_response=i + 1))
    a0, tok, n = s.batch(0, 0, 2)
    a1, _, _ = s.batch(0, 1, 2)
    again, _, _ = s.batch(0, 0, 2)
    assert [g.seq for g in a0] == [g.seq for g in again]
    assert sorted(g.seq for g in a0) + sorted(g.seq for g in a1) != []
    assert sorted([g.seq for g in a0] + [g.seq for g in a1]) == [0, 1, 2, 3]
    assert tok == sum(g.num_tokens for g in a0) + sum(g.num_tokens for g in a1)
    with pytest.raises(ValueError, match="ranks"):
        s.batch(0, 0, 3)


def test_not_ready_until_enough_groups():
    s = state(groups_per_step=2)
    (ls,) = s.grant("g", 1)
    s.ingest(group("g", 0, ls.lease_id))
    assert s.batch(0, 0, 1) is None
    assert len(s.ready) == 1  # nothing lost while waiting


def test_shard_balancing():
    shards = balance_shards([10, 1, 1, 1, 1, 6], 2)
    loads = [sum([10, 1, 1, 1, 1, 6][i] for i in s) for s in shards]
    assert sorted(loads) == [10, 10]
    assert all(shards)  # every rank gets something
    assert sorted(i for s in shards for i in s) == list(range(6))
    assert all(len(s) >= 1 for s in balance_shards([100, 1, 1], 3))


def test_expired_leases_are_reissued_first():
    s = state(groups_per_step=10, lease_timeout_s=1.0)
    s.hello("dead", now=0.0)
    lost = s.grant("dead", 3, now=0.0)
    s.hello("alive", now=100.0)
    expired = s.expire_leases(now=100.0)
    assert {ls.lease_id for ls in expired} == {ls.lease_id for ls in lost}
    again = s.grant("alive", 3, now=100.0)
    assert [ls.prompt_index for ls in again] == [ls.prompt_index for ls in lost]


def test_snapshot_round_trip():
    s = state(groups_per_step=2)
    leases = s.grant("g", 4)
    for i, ls in enumerate(leases[:3]):
        s.ingest(group("g", i, ls.lease_id))
    s.batch(0, 0, 1)
    snap = s.snapshot()
    t = BufferState(s.cfg, 100, 0)
    t.restore(snap, list(s.groups.values()))
    assert t.snapshot() == snap
    assert [g.seq for g in t.batch(0, 0, 1)[0]] == [g.seq for g in s.batch(0, 0, 1)[0]]
    assert [ls.prompt_index for ls in t.grant("g", 2)] == [
        ls.prompt_index for ls in s.grant("g", 2)
    ]


def test_sampled_accuracy_counts_every_group_before_the_filter():
    """The headline rollout accuracy is over all sampled responses, including the groups that
    dynamic sampling drops (all wrong or all right), over the last groups_per_step groups."""
    s = state(groups_per_step=2, max_staleness=3, dynamic_sampling=True)
    assert "rollout/sampled_accuracy" not in s.stats()
    a, b, c = s.grant("g", 3)
    assert s.ingest(group("g", 0, a.lease_id, acc=[0.0, 0.0])) == "stored"  # filtered
    assert s.counters.dropped["filtered"] == 1
    assert s.stats()["rollout/sampled_accuracy"] == 0.0
    s.ingest(group("g", 1, b.lease_id, acc=[1.0, 0.0]))
    assert s.stats()["rollout/sampled_accuracy"] == pytest.approx(0.25)
    s.ingest(group("g", 2, c.lease_id, acc=[1.0, 1.0]))  # the oldest group leaves the window
    assert s.stats()["rollout/sampled_accuracy"] == pytest.approx(0.75)


def test_a_checkpoint_beyond_the_learner_is_refused():
    """A forged CheckpointNotice(step=10**9) used to make every later batch request an error
    (the run wedged); a checkpoint of a step no rank asked for is refused and changes nothing."""
    s = state(groups_per_step=2, max_staleness=1)
    for i, ls in enumerate(s.grant("g", 2)):
        s.ingest(group("g", i, ls.lease_id))
    assert s.batch(0, 0, 1) is not None
    with pytest.raises(ValueError, match="beyond the learner's version"):
        s.mark_checkpoint(10**9)
    assert s.checkpointed_step == -1 and s.version == 0
    s.mark_checkpoint(0)  # the real one
    assert s.checkpointed_step == 0


def test_a_refused_id_cannot_silence_the_real_group_that_later_uses_it():
    """The insider hang: a peer sends groups under a real generator's id and next sequence
    numbers on leases it does not hold. They are refused; the real groups with those ids are
    then stored, not acked as duplicates (which left their leases outstanding for ever)."""
    s = state()
    leases = s.grant("g", 2)
    for seq in (0, 1):
        assert s.ingest(group("g", seq, 999)) == "rejected:unknown_lease"
    for seq, ls in enumerate(leases):
        assert s.ingest(group("g", seq, ls.lease_id)) == "stored"
    assert not s.leases and len(s.groups) == 2


def test_a_group_never_touches_a_lease_another_generator_holds():
    s = state()
    s.hello("h")
    (theirs,) = s.grant("h", 1)
    assert s.ingest(group("g", 0, theirs.lease_id)) == "rejected:unknown_lease"
    assert s.reject(group("g", 1, theirs.lease_id), "token_range") == "rejected:token_range"
    assert theirs.lease_id in s.leases  # still h's
    assert s.ingest(group("h", 0, theirs.lease_id)) == "stored"


def test_a_group_with_the_wrong_component_columns_frees_its_lease():
    import numpy as np

    s = state()
    (ls,) = s.grant("g", 1)
    bad = group("g", 0, ls.lease_id)
    bad.components = np.zeros((2, 5), np.float32)
    assert s.ingest(bad) == "rejected:component_names"
    assert not s.leases and not s.groups
    (again,) = s.grant("g", 1)
    assert again.prompt_index == ls.prompt_index  # leased again, not left outstanding


def test_ready_groups_stay_in_version_order_without_sorting_at_assembly():
    """Each group's oldest token version is computed once, at ingest, and the ready queue is
    kept in that order (then arrival): assembly takes from the left, and a restore re-sorts."""
    s = state(max_staleness=4, groups_per_step=2)
    s.advance(3)
    leases = s.grant("g", 5)
    for seq, (ls, v) in enumerate(zip(leases, (3, 1, 2, 1, 0))):
        assert s.ingest(group("g", seq, ls.lease_id, version=v)) == "stored"
    assert [s.oldest[g] for g in s.ready] == [0, 1, 1, 2, 3]
    assert [g[1] for g in s.ready] == [4, 1, 3, 2, 0]  # equal versions keep arrival order
    groups, _, n = s.batch(3, 0, 1)
    assert n == 2 and sorted(groups.group_ids()) == [("g", 1), ("g", 4)]
    assert [s.oldest[g] for g in s.ready] == [1, 2, 3] and len(s.oldest) == 3
