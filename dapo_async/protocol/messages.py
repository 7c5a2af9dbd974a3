"""Every message kind, defined once: a dataclass per kind whose plain-typed fields are the
msgpack header, ``validate()`` for what types alone cannot say (lengths that must agree,
ranges), and the kind → class table the decoder uses."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar

from dapo_async.protocol.checks import ProtocolError
from dapo_async.protocol.groups import GroupBatch

# Header fields that are counts, indices or waits in whichever message carries them.
NON_NEGATIVE_FIELDS = ("num_prompts", "step", "rank", "version", "world_size", "outbox_size", "pid",
                       "wait_s")  # fmt: skip


# Identifier fields (generator ids, hosts, engine names, checkpoint ids) and their bound.
NAME_FIELDS = ("generator_id", "host", "engine", "checkpoint_id")
MAX_NAME_CHARS = 256


@dataclass
class Message:
    """Base of all messages. Subclasses set KIND; fields typed with plain Python types are
    header fields; groups (if the class has HAS_GROUPS) travel as columnar arrays."""

    KIND: ClassVar[str] = ""
    HAS_GROUPS: ClassVar[bool] = False

    def validate(self) -> None:
        """What field types alone cannot say; raises ProtocolError. The base checks the
        counts, indices and waits every kind may carry (none may be negative) and the length
        of the names it may carry (ids are kept in memory: a 1 MB id is an attack)."""
        for name in NON_NEGATIVE_FIELDS:
            value = getattr(self, name, None)
            if value is not None and value < 0:
                raise ProtocolError("bad_value", f"{self.KIND}.{name} must be >= 0")
        for name in NAME_FIELDS:
            value = getattr(self, name, None)
            if isinstance(value, str) and len(value) > MAX_NAME_CHARS:
                raise ProtocolError("too_large", f"{self.KIND}.{name} over {MAX_NAME_CHARS} chars")


@dataclass
class GeneratorMessage(Message):
    """Base of the messages a generator sends about itself, named by ``generator_id`` (the
    buffer keys its leases and liveness by it)."""

    generator_id: str


@dataclass
class Hello(GeneratorMessage):
    """Generator → buffer, once at start (and after a buffer restart)."""

    KIND: ClassVar[str] = "hello"
    pid: int
    engine: str
    host: str = "127.0.0.1"
    # a spare generator (launch.spare_generators: decodes only on lent cores): steps never
    # wait for its leases; what it sends late goes stale like anyone's
    spare: bool = False


@dataclass
class Heartbeat(GeneratorMessage):
    """Generator → buffer, periodically: keeps its leases alive and says how it stands
    (``version``: the weights it holds; ``outbox_size``: groups sent and not yet acknowledged),
    which the buffer reports as ``buffer/generator_version_lag_max`` and
    ``buffer/generator_outbox``."""

    KIND: ClassVar[str] = "heartbeat"
    version: int
    outbox_size: int = 0


@dataclass
class LeaseRequest(GeneratorMessage):
    """Generator → buffer: ask for up to ``num_prompts`` prompts; ``version``: the weights the
    generator holds now (its groups' oldest tokens will be at least that recent)."""

    KIND: ClassVar[str] = "lease_request"
    num_prompts: int
    version: int = 0


@dataclass
class LeaseGrant(Message):
    """Buffer → generator: leased prompts (possibly none: then wait ``wait_s``)."""

    KIND: ClassVar[str] = "lease_grant"
    prompt_ids: list[int]
    prompts: list[list[int]]
    ground_truths: list[str]
    data_sources: list[str]
    version: int
    wait_s: float = 0.0
    # Generate these prompts with weights of at least this version (the staleness bound);
    # -1 = any.
    min_version: int = -1
    # The buffer's buffer.max_staleness (-1 = not said): a group whose oldest token is older
    # than the learner's version minus this is dropped as stale, so a generator restarts a
    # prompt that can no longer finish in time instead of decoding it to waste.
    max_staleness: int = -1
    # Each prompt's record ``extra_info`` as JSON text, for reward functions that take it
    # (empty: none).
    extra_infos: list[str] = field(default_factory=list)

    def validate(self) -> None:
        super().validate()
        n = len(self.prompt_ids)
        if not (len(self.prompts) == len(self.ground_truths) == len(self.data_sources) == n):
            raise ProtocolError("length_mismatch", "lease_grant lists differ in length")
        if self.extra_infos and len(self.extra_infos) != n:
            raise ProtocolError("length_mismatch", "lease_grant extra_infos differ in length")
        if any(len(p) == 0 or min(p) < 0 for p in self.prompts):
            raise ProtocolError("bad_value", "prompts must be non-empty token lists >= 0")
        if self.max_staleness < -1:
            raise ProtocolError("bad_value", "lease_grant max_staleness must be >= -1")


@dataclass
class ScoredGroups(Message):
    """Generator → buffer: 1..K scored groups (columnar arrays)."""

    KIND: ClassVar[str] = "scored_groups"
    HAS_GROUPS: ClassVar[bool] = True
    batch: GroupBatch = field(default_factory=GroupBatch.empty)


@dataclass
class Ack(Message):
    """Buffer → generator: per group id, ``stored`` | ``duplicate`` | ``rejected:<reason>``.
    Every status lets the generator drop the group from its outbox."""

    KIND: ClassVar[str] = "ack"
    group_ids: list[tuple[str, int]]
    statuses: list[str]

    def validate(self) -> None:
        if len(self.group_ids) != len(self.statuses):
            raise ProtocolError("length_mismatch", "ack group_ids and statuses differ in length")


@dataclass
class BatchRequest(Message):
    """Learner rank → buffer: my shard of step ``step``."""

    KIND: ClassVar[str] = "batch_request"
    rank: int
    world_size: int
    step: int

    def validate(self) -> None:
        super().validate()
        if not (self.world_size >= 1 and self.rank < self.world_size):
            raise ProtocolError("bad_value", "batch_request needs 0 <= rank < world_size")


@dataclass
class Batch(Message):
    """Buffer → learner rank: its shard of a step (``ready`` False: ask again after ``wait_s``)."""

    KIND: ClassVar[str] = "batch"
    HAS_GROUPS: ClassVar[bool] = True
    step: int
    rank: int
    ready: bool
    global_num_tokens: int = 0
    global_num_groups: int = 0
    wait_s: float = 0.0
    stats: dict[str, float] = field(
        default_factory=dict
    )  # buffer counters, for the learner's metrics
    batch: GroupBatch = field(default_factory=GroupBatch.empty)


@dataclass
class CheckpointNotice(Message):
    """Learner rank 0 → buffer: a checkpoint after ``step`` is complete (buffer compacts its
    log and frees that step's groups); ``checkpoint_id`` names it in both places."""

    KIND: ClassVar[str] = "checkpoint_notice"
    step: int
    checkpoint_id: str


@dataclass
class RewardRequest(Message):
    """Generator → reward server: score these texts (prompt + response, already formatted)."""

    KIND: ClassVar[str] = "reward_request"
    request_id: int
    texts: list[str]


@dataclass
class RewardReply(Message):
    """Reward server → generator: one score per text, or an error message."""

    KIND: ClassVar[str] = "reward_reply"
    request_id: int
    scores: list[float]
    error: str = ""


# Operations of the weight-sync store (``weight_sync/store.py``).
STORE_OPS = ("set", "get", "add", "check", "delete")
# A store key names a rendezvous entry (``wsync/3/0``, ``round/2/17``): short.
MAX_STORE_KEY_CHARS = 512
# Keys one ``check`` may name (a group's ranks; a few thousand at most).
MAX_STORE_KEYS = 4096


@dataclass
class StoreRequest(Message):
    """Weight-sync member → the learner's weight-sync store (the key-value rendezvous of the
    weight-sync group): one operation. ``value``: base64 of the bytes to ``set``, the decimal
    increment of ``add``."""

    KIND: ClassVar[str] = "store_request"
    request_id: int
    op: str
    keys: list[str]
    value: str = ""

    def validate(self) -> None:
        super().validate()
        if self.op not in STORE_OPS:
            raise ProtocolError("bad_value", f"store_request.op must be one of {STORE_OPS}")
        if not 1 <= len(self.keys) <= (MAX_STORE_KEYS if self.op == "check" else 1):
            raise ProtocolError("bad_value", f"store_request.keys: wrong count for {self.op}")
        if any(len(k) > MAX_STORE_KEY_CHARS for k in self.keys):
            raise ProtocolError("too_large", f"store_request key over {MAX_STORE_KEY_CHARS} chars")


@dataclass
class StoreReply(Message):
    """Weight-sync store → member: ``found`` (get: the key exists; check: all keys exist;
    delete: a key was removed), ``value`` (get: base64 of the bytes; add: the new counter), or
    ``error`` (the request was refused, e.g. a value over the store's size limit)."""

    KIND: ClassVar[str] = "store_reply"
    request_id: int
    found: bool
    value: str = ""
    error: str = ""


MESSAGE_TYPES: dict[str, type[Message]] = {
    cls.KIND: cls
    for cls in (
        Hello,
        Heartbeat,
        LeaseRequest,
        LeaseGrant,
        ScoredGroups,
        Ack,
        BatchRequest,
        Batch,
        CheckpointNotice,
        RewardRequest,
        RewardReply,
        StoreRequest,
        StoreReply,
    )
}

HINTS: dict[str, dict[str, Any]] = {
    kind: {
        f.name: typing.get_type_hints(cls)[f.name]
        for f in dataclasses.fields(cls)
        if f.name != "batch"
    }
    for kind, cls in MESSAGE_TYPES.items()
}
