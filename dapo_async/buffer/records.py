"""The buffer's records: a lease (a prompt handed to a generator) and a step's batch."""

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


@dataclass
class StepBatch:
    step: int
    group_ids: list[GroupId]
    shards: list[list[int]]  # per rank: indices into group_ids
    global_num_tokens: int
