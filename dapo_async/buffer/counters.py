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
    lease_reissued: int = 0
    dropped: Counter = field(default_factory=Counter)  # reason -> count
    rejected: Counter = field(default_factory=Counter)  # reason -> count (never stored)

    def to_dict(self) -> dict:
        return {
            "produced": self.produced,
            "accepted": self.accepted,
            "qualified": self.qualified,
            "trained": self.trained,
            "leased": self.leased,
            "lease_reissued": self.lease_reissued,
            "dropped": dict(self.dropped),
            "rejected": dict(self.rejected),
        }

    @classmethod
    def from_dict(cls, d: dict) -> Counters:
        c = cls(
            **{
                k: d[k]
                for k in (
                    "produced",
                    "accepted",
                    "qualified",
                    "trained",
                    "leased",
                    "lease_reissued",
                )
            }
        )
        c.dropped.update(d["dropped"])
        c.rejected.update(d["rejected"])
        return c
