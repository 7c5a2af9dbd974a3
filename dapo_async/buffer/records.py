"""The buffer's records: a lease (a prompt handed to a generator), which leases will not come
back in time (``late_leases``), how many outstanding leases admission counts
(``outstanding_allowed``) and the order of a surplus due at a step (``shuffle_due``), whether
one holds a step (``holds_step``: pacing), a step's batch, and how a step's groups are split
across learner ranks (``balance_shards``)."""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass

from dapo_async.protocol import GroupId

# Pacing does not wait for a lease whose generator has been silent this long (three missed
# heartbeats): a killed generator would otherwise hold the step until buffer.lease_timeout_s.
PACE_SILENT_S = 6.0


@dataclass
class Lease:
    lease_id: int
    prompt_index: int
    generator_id: str
    granted_at: float
    # the last step that may train this prompt's group: the generator's weights version when
    # it starts (clamped to the learner's) + max_staleness; assembly waits for it (pacing)
    deadline: int = 0


def late_leases(leases, generators: dict, waiting_since: dict, cfg, now: float) -> list:
    """(lease, why) for the leases to re-issue: "silent" (its generator unheard for
    ``cfg.lease_timeout_s``), "overdue" (``cfg.lease_deadline_s`` past its grant though its
    generator lives) or "stalled" (held ``cfg.stall_reissue_s`` while the learner has waited
    that long for a step: the watchdog)."""
    dead = {g for g, t in generators.items() if now - t > cfg.lease_timeout_s}
    stalled = bool(cfg.stall_reissue_s) and any(
        now - t > cfg.stall_reissue_s for t in waiting_since.values()
    )
    out = []
    for ls in leases:
        age = now - ls.granted_at
        if ls.generator_id in dead:
            out.append((ls, "silent"))
        elif cfg.lease_deadline_s and age > cfg.lease_deadline_s:
            out.append((ls, "overdue"))
        elif stalled and age > cfg.stall_reissue_s:
            out.append((ls, "stalled"))
    return out


def outstanding_allowed(free: int, recent) -> int:
    """The most leases that may be outstanding while ``free`` more groups may still count
    toward the steps up to a deadline, each lease counting as the share of the ``recent``
    groups (``(correct, responses, qualified)``) that passed dynamic sampling, plus one
    qualified as a prior: with no history each counts one, as when none is filtered. Counting
    each as one throttles the generators to a few groups a step once most are all-correct."""
    if free <= 0:
        return free
    kept = sum(1 for r in recent if r[2])
    return free * (len(recent) + 1) // (kept + 1)


def shuffle_due(ready: deque, oldest: dict, min_version: int, need: int, step: int) -> None:
    """When more ready groups are due at this step (oldest token ``min_version``: stale at the
    next) than the step takes, put them in a random order (seeded by ``step``: a replay
    assembles the same): the surplus dropped is then any of them, not the last to arrive —
    the longest responses (``outstanding_allowed`` lets admission overshoot by chance)."""
    head = 0
    while head < len(ready) and oldest[ready[head]] <= min_version:
        head += 1
    if sum(oldest[ready[i]] == min_version for i in range(head)) <= need:
        return
    due = [ready.popleft() for _ in range(head)]
    random.Random(step).shuffle(due)
    ready.extendleft(reversed(due))


def holds_step(leases, step: int, generators: dict, on_probation: dict, now: float) -> bool:
    """Pacing: whether step ``step`` waits for an outstanding lease due at it. A prompt still
    being generated must be trained at this step at the latest; the step waits for it rather
    than leave it to go stale (a long response is never dropped for being slow) — unless its
    generator fell silent (killed: PACE_SILENT_S) or is on probation (its leases were taken
    back by the watchdog or a deadline, or it sent a group refused on its own lease, and it
    has stored no group since)."""
    return any(
        ls.deadline == step
        and now - generators.get(ls.generator_id, 0.0) < PACE_SILENT_S
        and ls.generator_id not in on_probation
        for ls in leases
    )


@dataclass
class StepBatch:
    step: int
    group_ids: list[GroupId]
    shards: list[list[int]]  # per rank: indices into group_ids
    global_num_tokens: int


def balance_shards(tokens: list[int], world_size: int) -> list[list[int]]:
    """Assign items to ranks, largest first to the lightest rank; every rank gets at least one
    item when there are enough; each shard keeps the items' original order."""
    shards: list[list[int]] = [[] for _ in range(world_size)]
    load = [0] * world_size
    for i in sorted(range(len(tokens)), key=lambda i: -tokens[i]):
        r = min(range(world_size), key=lambda r: (len(shards[r]) > 0, load[r]))
        shards[r].append(i)
        load[r] += tokens[i]
    return [sorted(s) for s in shards]
