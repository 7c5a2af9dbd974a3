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


class MixtureCursor:
    """Prompts from several sources in proportion to their weights: draw k picks a source with
    an RNG seeded by (seed, k), then that source's own ``PromptCursor`` (its own epochs) gives
    the prompt; indices are global (source s's prompts follow those of sources < s). The state
    is the draw count, each source's cursor and the re-issue queue: exact resume as above."""

    def __init__(self, sizes, weights, seed: int = 0, draws: int = 0, cursors=None, requeued=()):
        if len(sizes) != len(weights) or not sizes:
            raise ValueError("a mixture needs one weight per source")
        if any(w <= 0 for w in weights):
            raise ValueError("mixture weights must be > 0")
        self.sizes, self.weights = list(sizes), [float(w) for w in weights]
        self.seed, self.draws = seed, draws
        self.cursors = cursors or [PromptCursor(n, seed * 31 + i) for i, n in enumerate(sizes)]
        self.offsets = [sum(self.sizes[:i]) for i in range(len(self.sizes))]
        self.num_prompts = sum(self.sizes)
        self.requeued: deque[int] = deque(requeued)
        total = sum(self.weights)
        self._cum = [sum(self.weights[: i + 1]) / total for i in range(len(self.weights))]

    def source_of(self, idx: int) -> int:
        return max(i for i, off in enumerate(self.offsets) if off <= idx)

    def next(self) -> int:
        if self.requeued:
            return self.requeued.popleft()
        r = random.Random(self.seed * 7_000_003 + self.draws).random()
        self.draws += 1
        s = next(i for i, c in enumerate(self._cum) if r < c or i == len(self._cum) - 1)
        return self.offsets[s] + self.cursors[s].next()

    def requeue(self, idx: int) -> None:
        self.requeued.append(idx)

    def state(self) -> dict:
        return {
            "kind": "mixture",
            "sizes": self.sizes,
            "weights": self.weights,
            "seed": self.seed,
            "draws": self.draws,
            "cursors": [c.state() for c in self.cursors],
            "requeued": list(self.requeued),
        }

    @classmethod
    def from_state(cls, state: dict) -> MixtureCursor:
        cursors = [PromptCursor.from_state(c) for c in state["cursors"]]
        return cls(
            state["sizes"], state["weights"], state["seed"], state["draws"], cursors,
            state["requeued"],
        )  # fmt: skip


def make_cursor(sizes: list[int], weights: list[float] | None, seed: int):
    """One source: a ``PromptCursor``; several: a ``MixtureCursor``."""
    if len(sizes) == 1:
        return PromptCursor(sizes[0], seed)
    return MixtureCursor(sizes, weights or [1.0] * len(sizes), seed)


def cursor_from_state(state: dict):
    if state.get("kind") == "mixture":
        return MixtureCursor.from_state(state)
    return PromptCursor.from_state(state)
