"""The replay buffer's state machine: leases, admission, ingest, filters, staleness, batches.
Pure logic (no sockets, no torch), driven by ``service.py`` and tested directly.

Life of a prompt and its group:

    lease(gen)  ──►  outstanding lease  ──►  ingest(group)  ──►  dedupe / validate
                                                                   │
                           dynamic sampling: zero variance ──► dropped("filtered")
                                                                   │
                                                          qualified (ready queue)
                                                                   │
    batch(step s, rank r) ── first request of step s assembles it: stale groups ──► dropped("stale")
                                                                   │
                                                  assigned to step s (shards by tokens)
                                                                   │
                          request for step s+1 ──► step s trained; freed at the next checkpoint

Admission and pacing (invariant 2, argued in docs/architecture.md): a lease gets a deadline
d = (its generator's weights version, clamped to [v − max_staleness, v]) + max_staleness, v = the
learner's version (highest step requested); it is granted only while ``qualified_total +
⌈q × outstanding⌉ + 1 ≤ (d + 1) × groups_per_step``, q the recent share of groups that qualify
(``buffer.admit_expected``; else 1). Assembly of step s waits while a lease due at s is
outstanding (pacing), then takes ready groups oldest token first (a slow group is trained in
time, not dropped); consumption re-checks the bound. Dropped groups go to ``on_drop``.
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable

import numpy as np

from dapo_async.algo.filters import dynamic_sampling_keep
from dapo_async.buffer import snapshot
from dapo_async.buffer.counters import Counters, state_stats
from dapo_async.buffer.records import (
    Lease,
    StepBatch,
    balance_shards,
    holds_step,
    late_leases,
    outstanding_allowed,
    shuffle_due,
)
from dapo_async.config import BufferConfig
from dapo_async.data.cursor import PromptCursor, make_cursor
from dapo_async.protocol import Group, GroupBatch, GroupId

# Group ids remembered after training, to ack late resends as duplicates (bounded memory).
MAX_REMEMBERED_IDS = 1_000_000


class BufferState:
    def __init__(
        self,
        cfg: BufferConfig,
        num_prompts: int,
        seed: int = 0,
        component_names=(),
        mixture: tuple[list[int], list[float]] | None = None,
    ):
        self.cfg = cfg
        # one source, or a weighted mixture (source sizes, weights): see data/cursor.py
        self.cursor = make_cursor(*mixture, seed) if mixture else PromptCursor(num_prompts, seed)
        self.component_names = list(component_names)
        # (group, reason) of a filtered or stale group: set by the service after recovery
        self.on_drop: Callable[[Group, str], None] = lambda group, reason: None
        self.version = 0  # learner version = highest step requested
        self.next_lease_id = 0
        self.leases: dict[int, Lease] = {}
        self.generators: dict[str, float] = {}  # id -> last seen
        self.groups: dict[GroupId, Group] = {}  # stored: qualified, not yet freed
        # qualified, unassigned; by oldest token version (``oldest``), then arrival
        self.ready: deque[GroupId] = deque()
        self.oldest: dict[GroupId, int] = {}
        self.steps: OrderedDict[int, StepBatch] = OrderedDict()
        self.counted_steps: set[int] = set()  # steps whose groups count as trained
        self.rank_steps: dict[int, int] = {}  # learner rank -> last step it asked for
        self.checkpointed_step = -1
        self.waiting_since: dict[int, float] = {}  # step -> first wait (watchdog; not saved)
        # generator -> when its leases were taken back or it sent a group refused on its own
        # lease: one lease at a time, unpaced, until it stores a group (stalls the run once)
        self.on_probation: dict[str, float] = {}
        self.spares: set[str] = set()  # Hello.spare: decode while the learner waits; unpaced
        self.seen: OrderedDict[GroupId, None] = OrderedDict()
        self.counters = Counters()
        self.staleness_hist: Counter = Counter()  # per-token staleness at assembly
        # response lengths qualified and trained: equal unless fast (short) ones are favoured
        self.len_hist = {"qualified": Counter(), "trained": Counter()}
        # (correct, responses, qualified) of the last groups received: sampled accuracy, q
        self.recent_sampled: deque[tuple] = deque(maxlen=max(1, cfg.groups_per_step))

    def oldest_allowed_version(self) -> int:
        """The oldest policy version whose tokens may still be trained at the next step
        (invariant 2): a generator holding older weights waits for newer ones."""
        return max(0, self.version - self.cfg.max_staleness)

    def deadline(self, weights_version: int) -> int:
        """The last step that may train a group a generator holding ``weights_version`` starts
        now: its oldest token has at least that version (clamped to what the buffer allows and
        to the learner's version: a larger claim is not believed)."""
        start = min(max(weights_version, self.oldest_allowed_version()), self.version)
        return start + self.cfg.max_staleness

    def admissible(self, deadline: int | None = None) -> int:
        """How many more prompts may be leased now whose groups must be trained by step
        ``deadline`` (default: a generator holding the learner's version): every group counted
        so far, plus these, must fit into the steps up to it (admission rule), and memory."""
        # qualified groups dropped later (stale at assembly, rolled back on resume) no longer
        # count: otherwise a run whose generator lagged one version would starve forever
        d = self.counters.dropped
        usable = self.counters.qualified - d.get("stale", 0) - d.get("rolled_back", 0)
        last = self.deadline(self.version) if deadline is None else deadline
        free = (last + 1) * self.cfg.groups_per_step - usable
        if self.cfg.admit_expected:  # a lease counts as the recent share of groups qualified
            free = outstanding_allowed(free, self.recent_sampled)
        by_staleness = free - len(self.leases)
        by_memory = self.cfg.max_buffered_groups - len(self.groups) - len(self.leases)
        return max(0, min(by_staleness, by_memory))

    def grant(
        self,
        generator_id: str,
        num: int,
        now: float | None = None,
        weights_version: int = 0,
        replay: bool = False,
    ) -> list[Lease]:
        """Up to ``num`` leases, within the generator's cap (no hoarding) and admission;
        ``replay``: exactly ``num`` (the log holds the count granted)."""
        now = time.monotonic() if now is None else now
        self.generators[generator_id] = now
        deadline = self.deadline(weights_version)
        cap = 1 if generator_id in self.on_probation else self.cfg.max_leases_per_generator
        held = sum(ls.generator_id == generator_id for ls in self.leases.values())
        room = num if replay else min(num, cap - held if cap else num, self.admissible(deadline))
        out = []
        for _ in range(room):
            lease = Lease(self.next_lease_id, self.cursor.next(), generator_id, now, deadline)
            self.next_lease_id += 1
            self.leases[lease.lease_id] = lease
            out.append(lease)
        self.counters.leased += len(out)
        return out

    def hello(self, generator_id: str, now: float | None = None, spare: bool = False) -> None:
        self.generators[generator_id] = time.monotonic() if now is None else now
        self.spares.add(generator_id) if spare else self.spares.discard(generator_id)

    def heartbeat(self, generator_id: str, now: float | None = None) -> None:
        self.generators[generator_id] = time.monotonic() if now is None else now

    def expire_leases(self, now: float | None = None) -> list[Lease]:
        """Re-issue the prompts of leases that will not come back in time: those of generators
        silent for lease_timeout_s; those past lease_deadline_s since their grant (a stuck or
        hoarding generator that still heartbeats); and, when the learner has waited
        stall_reissue_s for a step, those held that long (the watchdog)."""
        now = time.monotonic() if now is None else now
        late = late_leases(self.leases.values(), self.generators, self.waiting_since, self.cfg, now)
        self.counters.lease_overdue += sum(why == "overdue" for _, why in late)
        self.counters.lease_stalled += sum(why == "stalled" for _, why in late)
        self.on_probation.update((ls.generator_id, now) for ls, why in late if why != "silent")
        lost = [ls for ls, _ in late]
        for ls in lost:
            del self.leases[ls.lease_id]
            self.cursor.requeue(ls.prompt_index)
        self.counters.lease_reissued += len(lost)
        return lost

    # ------------------------------------------------------------------ ingest

    def ingest(self, group: Group) -> str:
        """Store one validated group; returns the ack status."""
        gid = group.group_id
        status = self._sender_status(group)
        if status:
            return status
        if group.components.shape[1] != len(self.component_names):
            return self.reject(group, "component_names")
        lease = self.leases.get(group.prompt_id)
        if lease is None or lease.generator_id != group.generator_id:
            # not remembered: an id refused here must not make a later real group a duplicate
            return self.refuse(group.prompt_id, group.generator_id, "unknown_lease")
        del self.leases[group.prompt_id]
        self.on_probation.pop(group.generator_id, None)
        self._remember(gid)
        self.counters.count_received(group.response_lens)
        self.generators[group.generator_id] = time.monotonic()
        metric = group.acc if self.cfg.filter_metric == "acc" else group.rewards
        keep = True
        if self.cfg.dynamic_sampling:
            lo, hi, sizes = self.cfg.min_group_acc, self.cfg.max_group_acc, [group.num_responses]
            keep = bool(dynamic_sampling_keep(metric, np.array(sizes), group.acc, lo, hi)[0])
        self.recent_sampled.append((float(np.sum(group.acc)), group.num_responses, keep))
        if not keep:
            self.counters.dropped["filtered"] += 1
            self.counters.tokens_filtered += int(group.response_lens.sum())
            self.on_drop(group, "filtered")
            return "stored"
        self.groups[gid] = group
        self._enqueue(gid, self._oldest_version(gid))
        self.counters.qualified += 1
        self.len_hist["qualified"].update(group.response_lens.tolist())
        return "stored"

    def reject(self, group: Group, reason: str) -> str:
        """Refuse a group for ``reason`` (semantic checks): nothing stored; its lease's prompt is
        leased again if that lease is its sender's. Its id is not remembered: a refused id sent
        under another generator's name cannot make that one's real group a duplicate."""
        status = self._sender_status(group)
        if status:
            return status
        return self.refuse(group.prompt_id, group.generator_id, reason)

    def refuse(self, lease_id: int, generator_id: str, reason: str) -> str:
        """What a refused group changes: a count, and the lease it names re-leased when its
        sender holds it (the write-ahead log records these three values, not the group)."""
        lease = self.leases.get(lease_id)
        if lease is not None and lease.generator_id == generator_id:
            del self.leases[lease_id]
            self.cursor.requeue(lease.prompt_index)
            self.on_probation[generator_id] = time.monotonic()  # it sent what checks refuse
        self.counters.rejected[reason] += 1
        return f"rejected:{reason}"

    def _sender_status(self, group: Group) -> str:
        """The ack for a group from an unknown generator or already seen ("" otherwise): the
        answers ``ingest`` and ``reject`` give before looking at the group itself."""
        if group.generator_id not in self.generators:
            self.counters.rejected["unknown_generator"] += 1
            return "retry:hello"  # the generator re-introduces itself and resends
        if group.group_id in self.seen:
            self.counters.rejected["duplicate"] += 1
            return "duplicate"
        return ""

    def _enqueue(self, gid: GroupId, oldest: int) -> None:
        """Insert into ``ready`` after every group no newer than it (groups mostly arrive in
        version order: the walk from the right stops at once)."""
        self.oldest[gid] = oldest
        i = len(self.ready)
        while i > 0 and self.oldest[self.ready[i - 1]] > oldest:
            i -= 1
        self.ready.insert(i, gid)

    def reindex_ready(self) -> None:
        """Rebuild ``oldest`` and the order of ``ready`` (after a restore)."""
        self.oldest = {gid: self._oldest_version(gid) for gid in self.ready}
        self.ready = deque(sorted(self.ready, key=self.oldest.__getitem__))

    def _remember(self, gid: GroupId) -> None:
        self.seen[gid] = None
        if len(self.seen) > MAX_REMEMBERED_IDS:
            self.seen.popitem(last=False)

    # ------------------------------------------------------------------ batches

    def advance(self, step: int, rank: int = 0, world_size: int = 1) -> None:
        """Rank ``rank`` asks for ``step``: steps before the slowest rank's are trained. A rank
        asking for an earlier step than it asked before resumed from a checkpoint: re-base."""
        last = self.rank_steps.get(rank)
        if last is not None and step < last:
            self._rollback(step)
            self.rank_steps = {}
        self.rank_steps[rank] = step
        self.version = max(self.rank_steps.values())
        if len(self.rank_steps) >= world_size:
            self._count_trained(min(self.rank_steps.values()))

    def _count_trained(self, upto: int) -> None:
        for s, sb in self.steps.items():
            if s < upto and s not in self.counted_steps:
                self.counted_steps.add(s)
                self.counters.trained += len(sb.group_ids)

    def _rollback(self, step: int) -> None:
        for s in sorted(self.counted_steps):
            if s >= step and s in self.steps:
                self.counted_steps.discard(s)
                self.counters.trained -= len(self.steps[s].group_ids)
        # groups made by weights newer than the resumed version no longer exist as a policy
        keep = deque()
        for gid in self.ready:
            g = self.groups[gid]
            if g.num_tokens and int(g.versions.max()) > step:
                del self.groups[gid]
                del self.oldest[gid]
                self.counters.dropped["rolled_back"] += 1
            else:
                keep.append(gid)
        self.ready = keep

    def batch(self, step: int, rank: int, world_size: int) -> tuple[GroupBatch, int, int] | None:
        """This rank's shard of ``step``: (groups, global tokens, global groups); None while
        not enough qualified groups exist. Asking again returns the same shard."""
        if step < self.checkpointed_step + 1:
            raise ValueError(
                f"step {step} was already checkpointed (next is {self.checkpointed_step + 1})"
            )
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} not in world of {world_size}")
        self.advance(step, rank, world_size)
        sb = self.steps.get(step)
        if sb is None:
            sb = self._assemble(step, world_size)
            if sb is None:
                return None
        if len(sb.shards) != world_size:
            raise ValueError(
                f"step {step} was assembled for {len(sb.shards)} ranks, not {world_size}"
            )
        ids = [sb.group_ids[i] for i in sb.shards[rank]]
        groups = [self.groups[g] for g in ids]
        return (
            GroupBatch.from_groups(groups, self.component_names),
            sb.global_num_tokens,
            len(sb.group_ids),
        )

    def _assemble(self, step: int, world_size: int) -> StepBatch | None:
        need = self.cfg.groups_per_step
        if need < world_size:
            raise ValueError(
                f"buffer.groups_per_step ({need}) must be >= the number of learner ranks ({world_size})"
            )
        now = time.monotonic()
        unpaced = self.on_probation | dict.fromkeys(self.spares, now)  # no step waits for them
        if holds_step(self.leases.values(), step, self.generators, unpaced, now):
            self.counters.paced_waits += 1
            self.waiting_since.setdefault(step, now)
            return None
        min_version = step - self.cfg.max_staleness
        # oldest first (earliest deadline), then arrival: a slow group is not overtaken; more
        # due now than fit are chosen at random (a surplus admission let in: see records)
        shuffle_due(self.ready, self.oldest, min_version, need, step)
        picked: list[tuple[GroupId, int]] = []
        while self.ready and len(picked) < need:
            gid = self.ready.popleft()
            oldest = self.oldest.pop(gid)
            if oldest < min_version:
                self.on_drop(self.groups.pop(gid), "stale")
                self.counters.dropped["stale"] += 1
                continue
            picked.append((gid, oldest))
        if len(picked) < need:
            for gid, oldest in reversed(picked):
                self.oldest[gid] = oldest
                self.ready.appendleft(gid)
            self.waiting_since.setdefault(step, now)
            return None
        self.waiting_since.pop(step, None)
        fresh = [gid for gid, _ in picked]
        tokens = [self.groups[g].num_tokens for g in fresh]
        for g in fresh:
            self.len_hist["trained"].update(self.groups[g].response_lens.tolist())
            vals, counts = np.unique(step - self.groups[g].versions, return_counts=True)
            for v, c in zip(vals.tolist(), counts.tolist()):
                self.staleness_hist[int(v)] += int(c)
        sb = StepBatch(step, fresh, balance_shards(tokens, world_size), int(sum(tokens)))
        self.steps[step] = sb
        return sb

    def _oldest_version(self, gid: GroupId) -> int:
        g = self.groups[gid]
        return int(g.versions.min()) if g.num_tokens else self.version

    def mark_checkpoint(self, step: int) -> None:
        """The learner checkpointed after finishing ``step``: groups of steps <= step are freed.
        A step no learner rank has asked for yet cannot have been checkpointed (ValueError): a
        forged notice far ahead would otherwise refuse every later batch request."""
        if step > self.version:
            raise ValueError(
                f"checkpoint of step {step} beyond the learner's version {self.version}"
            )
        self._count_trained(step + 1)
        self.version = max(self.version, step + 1)
        self.checkpointed_step = max(self.checkpointed_step, step)
        for s in [s for s in self.steps if s <= step]:
            for g in self.steps.pop(s).group_ids:
                self.groups.pop(g, None)

    def snapshot(self) -> dict:  # JSON; the groups travel beside it (wal.py)
        return snapshot.dump(self)

    def restore(self, snap: dict, groups: list[Group]) -> None:  # a snapshot and its groups
        snapshot.load(self, snap, groups)

    def expire_ids(self, lease_ids: list[int]) -> None:
        """Replay of ``expire_leases``: drop exactly these leases."""
        for lid in lease_ids:
            ls = self.leases.pop(lid, None)
            if ls is not None:
                self.cursor.requeue(ls.prompt_index)
                self.counters.lease_reissued += 1

    def stats(self) -> dict[str, float]:
        return state_stats(self)
