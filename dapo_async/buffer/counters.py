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
    # response tokens of the groups received, and of those dynamic sampling dropped (zero
    # variance): the share of the generators' decoding that trains nothing
    tokens_produced: int = 0
    tokens_filtered: int = 0
    dropped: Counter = field(default_factory=Counter)  # reason -> count
    rejected: Counter = field(default_factory=Counter)  # reason -> count (never stored)

    def count_received(self, response_lens) -> None:
        """A group received for the first time, with its responses' lengths."""
        self.produced += 1
        self.accepted += 1
        self.tokens_produced += int(sum(response_lens))

    def filtered_token_share(self) -> float | None:
        """The share of the response tokens received that were in groups dynamic sampling
        dropped: the generators' decoding that trained nothing (None before any token)."""
        return self.tokens_filtered / self.tokens_produced if self.tokens_produced else None

    def to_dict(self) -> dict:
        out: dict = {name: getattr(self, name) for name in COUNT_FIELDS}
        return out | {"dropped": dict(self.dropped), "rejected": dict(self.rejected)}

    @classmethod
    def from_dict(cls, d: dict) -> Counters:
        c = cls(**{name: d.get(name, 0) for name in COUNT_FIELDS})
        c.dropped.update(d.get("dropped", {}))
        c.rejected.update(d.get("rejected", {}))
        return c


# The plain counts of Counters, in snapshot order.
COUNT_FIELDS = (
    "produced", "accepted", "qualified", "trained", "leased", "lease_reissued", "lease_overdue",
    "lease_stalled", "paced_waits", "tokens_produced", "tokens_filtered",
)  # fmt: skip


def state_stats(state) -> dict[str, float]:
    """A ``BufferState``'s metrics (``buffer/*``, and ``rollout/sampled_accuracy``)."""
    c = state.counters
    out = {
        "buffer/version": float(state.version),
        "buffer/occupancy": float(len(state.groups)),
        "buffer/ready": float(len(state.ready)),
        "buffer/outstanding_leases": float(len(state.leases)),
        **{
            f"buffer/{name}": float(getattr(c, name)) for name in COUNT_FIELDS if name != "accepted"
        },
    }
    if state.recent_sampled:
        correct = sum(r[0] for r in state.recent_sampled)
        out["rollout/sampled_accuracy"] = correct / sum(r[1] for r in state.recent_sampled)
    share = c.filtered_token_share()
    if share is not None:
        out["buffer/filtered_token_share"] = share
    out.update({f"buffer/dropped_{k}": float(v) for k, v in c.dropped.items()})
    out.update({f"buffer/rejected_{k}": float(v) for k, v in c.rejected.items()})
    return out
