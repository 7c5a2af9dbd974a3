"""The buffer state as JSON (``dump``) and back (``load``): what the write-ahead log's snapshot
record holds at each compaction. The stored groups travel beside it as protocol frames."""

from __future__ import annotations

import time
from collections import Counter, OrderedDict, deque

from dapo_async.buffer.counters import Counters
from dapo_async.buffer.records import Lease, StepBatch
from dapo_async.data.cursor import cursor_from_state
from dapo_async.protocol import Group

# Ids kept in a snapshot: generators resend only unacknowledged groups, a few outboxes' worth.
SNAPSHOT_SEEN_IDS = 100_000


def dump(self) -> dict:
    """JSON-able state except the stored groups (those go next to it)."""
    return {
        "cursor": self.cursor.state(),
        "version": self.version,
        "next_lease_id": self.next_lease_id,
        "leases": [
            [ls.lease_id, ls.prompt_index, ls.generator_id, ls.deadline]
            for ls in self.leases.values()
        ],
        "generators": sorted(self.generators),
        "ready": [list(g) for g in self.ready],
        "steps": [
            [sb.step, [list(g) for g in sb.group_ids], sb.shards, sb.global_num_tokens]
            for sb in self.steps.values()
        ],
        "counted_steps": sorted(self.counted_steps),
        "rank_steps": {str(k): v for k, v in self.rank_steps.items()},
        "checkpointed_step": self.checkpointed_step,
        "seen": [list(g) for g in list(self.seen)[-SNAPSHOT_SEEN_IDS:]],
        "counters": self.counters.to_dict(),
        "staleness_hist": {str(k): v for k, v in self.staleness_hist.items()},
        "component_names": self.component_names,
        "len_hist": {k: {str(n): c for n, c in h.items()} for k, h in self.len_hist.items()},
    }


def load(self, snap: dict, groups: list[Group]) -> None:
    now = time.monotonic()
    self.cursor = cursor_from_state(snap["cursor"])
    self.version = snap["version"]
    self.next_lease_id = snap["next_lease_id"]
    self.leases = {row[0]: Lease(row[0], row[1], row[2], now, *row[3:]) for row in snap["leases"]}
    self.generators = {g: now for g in snap["generators"]}
    self.groups = {g.group_id: g for g in groups}
    self.ready = deque(tuple(g) for g in snap["ready"])
    self.reindex_ready()
    self.steps = OrderedDict(
        (s, StepBatch(s, [tuple(g) for g in ids], shards, tok))
        for s, ids, shards, tok in snap["steps"]
    )
    self.counted_steps = set(snap["counted_steps"])
    self.rank_steps = {int(k): v for k, v in snap["rank_steps"].items()}
    self.checkpointed_step = snap["checkpointed_step"]
    self.seen = OrderedDict((tuple(g), None) for g in snap["seen"])
    self.counters = Counters.from_dict(snap["counters"])
    self.staleness_hist = Counter({int(k): v for k, v in snap["staleness_hist"].items()})
    self.component_names = snap["component_names"]
    for k, h in snap.get("len_hist", {}).items():
        self.len_hist[k] = Counter({int(n): c for n, c in h.items()})
