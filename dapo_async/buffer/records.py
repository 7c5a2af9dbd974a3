"""The buffer's records: a lease (a prompt handed to a generator) and which leases will not come
back in time (``late_leases``), a step's batch, and how a step's groups are split across learner
ranks (``balance_shards``)."""

from __future__ import annotations

from dataclasses import dataclass

from dapo_async.protocol import GroupId


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
