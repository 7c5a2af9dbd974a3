"""Every cross-process message of dapo_async, defined once, and its wire format.

Owns: the message dataclasses (``messages``), the columnar group batch (``groups``), the header
type checker (``checks``) and the wire encoding with its validating decoder (``wire``).
Imports neither torch nor vLLM (numpy, msgpack only). No pickle anywhere: a message is

    frame 0: msgpack header {"v": SCHEMA_VERSION, "k": kind, "h": {fields},
                             "a": [[name, dtype, shape, byte offset], ...]}
    frame 1 (messages that carry groups): one data frame holding every array, little-endian,
             8-byte aligned, at the offsets named in "a"

A ``GroupBatch`` is built directly in that packed layout, so encoding sends its buffer without a
copy, and decoding yields numpy views of the received frame. ``decode`` validates kind, schema version, header field types, array names,
dtypes, shapes and byte lengths, length consistency between arrays, finite values and size limits;
every failure raises ``ProtocolError`` with a short ``reason`` code for counters.

Scored groups travel columnar (``GroupBatch``): one message holds 1..K groups whose per-token
arrays are concatenated, so batching K groups costs one header and one data frame.
"""

from __future__ import annotations

# re-exports: ``from dapo_async import protocol`` then ``protocol.Hello``, ``protocol.encode`` …
from dapo_async.protocol.checks import ProtocolError
from dapo_async.protocol.groups import (
    FINISH_ABORT,
    FINISH_LENGTH,
    FINISH_REASONS,
    FINISH_STOP,
    LOGPROB_TOLERANCE,
    Group,
    GroupBatch,
    GroupId,
)
from dapo_async.protocol.messages import (
    MESSAGE_TYPES,
    Ack,
    Batch,
    BatchRequest,
    CheckpointNotice,
    GeneratorMessage,
    Heartbeat,
    Hello,
    LeaseGrant,
    LeaseRequest,
    Message,
    RewardReply,
    RewardRequest,
    ScoredGroups,
    StoreReply,
    StoreRequest,
)
from dapo_async.protocol.wire import (
    DEFAULT_MAX_MESSAGE_BYTES,
    MAX_FRAMES,
    MAX_HEADER_BYTES,
    SCHEMA_VERSION,
    decode,
    encode,
)

__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES",
    "FINISH_ABORT",
    "FINISH_LENGTH",
    "FINISH_REASONS",
    "FINISH_STOP",
    "LOGPROB_TOLERANCE",
    "MAX_FRAMES",
    "MAX_HEADER_BYTES",
    "MESSAGE_TYPES",
    "SCHEMA_VERSION",
    "Ack",
    "Batch",
    "BatchRequest",
    "CheckpointNotice",
    "GeneratorMessage",
    "Group",
    "GroupBatch",
    "GroupId",
    "Heartbeat",
    "Hello",
    "LeaseGrant",
    "LeaseRequest",
    "Message",
    "ProtocolError",
    "RewardReply",
    "RewardRequest",
    "ScoredGroups",
    "StoreReply",
    "StoreRequest",
    "decode",
    "encode",
]
