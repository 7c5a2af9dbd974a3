"""A deterministic, resumable prompt cursor: one shuffled order per epoch.

The order of epoch e is a permutation seeded by (seed, e), so the cursor's whole state is
``(epoch, position)`` plus the set of prompts whose leases were lost and must be re-issued
before new ones. ``state()`` / ``from_state()`` round-trip it through JSON for exact resume.
"""

from __future__ import annotations

import random
from collections import deque


class PromptCursor:
    def __init__(
        self, num_prompts: int, seed: int = 0, epoch: int = 0, position: int = 0, requeued=()
    ):
        if num_prompts <= 0:
            raise ValueError("the dataset has no prompts (after filtering)")
        self.num_prompts = num_prompts
        self.seed = seed
        self.epoch = epoch
        self.position = position
        self.requeued: deque[int] = deque(requeued)
        self._order = self._permutation(epoch)

    def _permutation(self, epoch: int) -> list[int]:
        order = list(range(self.num_prompts))
        random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        return order

    def next(self) -> int:
        """The next prompt index: re-issued prompts first, then the epoch order."""
        if self.requeued:
            return self.requeued.popleft()
        if self.position >= self.num_prompts:
            self.epoch += 1
            self.position = 0
            self._order = self._permutation(self.epoch)
        idx = self._order[self.position]
        self.position += 1
        return idx

    def requeue(self, idx: int) -> None:
        """A lease was lost: hand this prompt out again before new ones."""
        self.requeued.append(idx)

    def state(self) -> dict:
        return {
            "num_prompts": self.num_prompts,
            "seed": self.seed,
            "epoch": self.epoch,
            "position": self.position,
            "requeued": list(self.requeued),
        }

    @classmethod
    def from_state(cls, state: dict) -> PromptCursor:
        return cls(
            state["num_prompts"],
            state["seed"],
            state["epoch"],
            state["position"],
            state["requeued"],
        )
