"""The buffer's durable counters: every group received is accounted for (produced = trained +
dropped-with-reason + still held), and every message refused is counted by reason. Snapshotted
with the buffer state and restored on resume."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class Counters:
    produced: int = 0  # groups received (first time)
    accepted: int = 0
    qualified: int = 0
    trained: int = 0
    leased: int = 0
    lease_reissued: int = 0  # leases of silent generators, overdue or stalled, re-issued
    lease_overdue: int = 0  # of those: past buffer.lease_deadline_s while their holder lived
    lease_stalled: int = 0  # of those: re-issued by the watchdog (the learner waited)
    paced_waits: int = 0  # batch requests that waited for a prompt due at that step
    dropped: Counter = field(default_factory=Counter)  # reason -> count
    rejected: Counter = field(default_factory=Counter)  # reason -> count (never stored)

    def to_dict(self) -> dict:
        out: dict = {name: getattr(self, name) for name in COUNT_FIELDS}
        return out | {"dropped": dict(self.dropped), "rejected": dict(self.rejected)}

    @classmethod
    def from_dict(cls, d: dict) -> Counters:
        c = cls(**{name: d.get(name, 0) for name in COUNT_FIELDS})
        c.dropped.update(d["dropped"])
        c.rejected.update(d["rejected"])
        return c


# The plain counts of Counters, in snapshot order.
COUNT_FIELDS = (
    "produced", "accepted", "qualified", "trained", "leased", "lease_reissued", "lease_overdue",
    "lease_stalled", "paced_waits",
)  # fmt: skip
