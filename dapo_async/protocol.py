"""Every cross-process message of dapo_async, defined once, and its wire format.

Owns: the message dataclasses, their encoding into ZeroMQ frames and the validating decoder.
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

import dataclasses
import math
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import msgpack
import numpy as np

SCHEMA_VERSION = 1
# A header is a few hundred bytes; 4 MiB leaves room for a batch of thousands of group ids.
MAX_HEADER_BYTES = 4 << 20
# Default bound on one message (all frames); a step batch of a large model fits well inside.
DEFAULT_MAX_MESSAGE_BYTES = 256 << 20
# Frames per message: a header, plus one data frame for messages that carry groups.
MAX_FRAMES = 2
# A behaviour log-prob is <= 0; engines round, so allow this much above zero.
LOGPROB_TOLERANCE = 1e-3

FINISH_STOP = 0
FINISH_LENGTH = 1
FINISH_ABORT = 2
FINISH_REASONS = {"stop": FINISH_STOP, "length": FINISH_LENGTH, "abort": FINISH_ABORT}

_DTYPES = {
    "int32": np.dtype("<i4"),
    "int64": np.dtype("<i8"),
    "float32": np.dtype("<f4"),
    "uint8": np.dtype("|u1"),
}


class ProtocolError(ValueError):
    """A message failed validation. ``reason`` is a short code used in drop counters."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


# --------------------------------------------------------------------------- header typing


def _check_value(value: Any, tp: Any, where: str) -> Any:
    """Validate a decoded header value against a type annotation; returns the value."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin is typing.Union or origin is types.UnionType:
        for arg in typing.get_args(tp):
            try:
                return _check_value(value, arg, where)
            except ProtocolError:
                continue
        raise ProtocolError("bad_field", f"{where}: unexpected {type(value).__name__}")
    if tp is type(None):
        if value is not None:
            raise ProtocolError("bad_field", f"{where}: expected None")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ProtocolError("bad_field", f"{where}: expected bool, got {type(value).__name__}")
        return value
    if tp is int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise ProtocolError("bad_field", f"{where}: expected int, got {type(value).__name__}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ProtocolError("bad_field", f"{where}: expected float, got {type(value).__name__}")
        if not math.isfinite(value):
            raise ProtocolError("non_finite", f"{where}: {value}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ProtocolError("bad_field", f"{where}: expected str, got {type(value).__name__}")
        return value
    if origin in (list, Sequence):
        if not isinstance(value, (list, tuple)):
            raise ProtocolError("bad_field", f"{where}: expected list, got {type(value).__name__}")
        (arg,) = typing.get_args(tp) or (Any,)
        if arg in (str, int) and all(type(v) is arg for v in value):  # fast path, long id lists
            return list(value)
        return [_check_value(v, arg, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is tuple:
        args = typing.get_args(tp)
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            raise ProtocolError("bad_field", f"{where}: expected a {len(args)}-tuple")
        return tuple(
            _check_value(v, a, f"{where}[{i}]")
            for i, (v, a) in enumerate(zip(value, args, strict=False))
        )
    if origin is dict:
        kt, vt = typing.get_args(tp)
        if not isinstance(value, dict):
            raise ProtocolError("bad_field", f"{where}: expected map, got {type(value).__name__}")
        return {
            _check_value(k, kt, f"{where}.key"): _check_value(v, vt, f"{where}[{k!r}]")
            for k, v in value.items()
        }
    raise AssertionError(f"unsupported annotation {tp!r} at {where}")  # internal invariant


# --------------------------------------------------------------------------- groups


GroupId = tuple[str, int]


@dataclass
class Group:
    """One prompt's G scored responses, with per-token behaviour log-probs and versions.

    Token arrays are flat over the G responses; ``response_lens`` splits them.
    """

    generator_id: str
    seq: int
    prompt_id: int
    prompt_tokens: np.ndarray  # int32 [P]
    response_lens: np.ndarray  # int32 [G]
    tokens: np.ndarray  # int32 [T] (T = sum response_lens)
    logprobs: np.ndarray  # float32 [T], behaviour log-probs of the sampled tokens
    versions: np.ndarray  # int32 [T], policy version that produced each token
    rewards: np.ndarray  # float32 [G], total reward
    acc: np.ndarray  # float32 [G], correctness in {0, 1}
    components: np.ndarray  # float32 [G, C], reward components (names on the batch)
    finish: np.ndarray  # uint8 [G], FINISH_* codes
    gen_time_s: float = 0.0

    @property
    def group_id(self) -> GroupId:
        return (self.generator_id, self.seq)

    @property
    def num_responses(self) -> int:
        return int(self.response_lens.shape[0])

    @property
    def num_tokens(self) -> int:
        return int(self.tokens.shape[0])


# Array names of the columnar group layout, in frame order, with dtype and ndim.
_GROUP_ARRAYS: dict[str, tuple[str, int]] = {
    "seqs": ("int64", 1),
    "prompt_ids": ("int64", 1),
    "gen_time_s": ("float32", 1),
    "prompt_lens": ("int32", 1),
    "prompt_tokens": ("int32", 1),
    "num_responses": ("int32", 1),
    "response_lens": ("int32", 1),
    "rewards": ("float32", 1),
    "acc": ("float32", 1),
    "components": ("float32", 2),
    "finish": ("uint8", 1),
    "tokens": ("int32", 1),
    "logprobs": ("float32", 1),
    "versions": ("int32", 1),
}


# Column offsets inside the data frame are multiples of this (aligned numpy views).
_ALIGN = 8


def _alloc_packed(shapes: dict[str, tuple[int, ...]]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """One uint8 buffer holding every group column, and the typed views into it."""
    shapes = {name: shapes[name] for name in _GROUP_ARRAYS}  # wire order
    offsets, total = {}, 0
    for name, shape in shapes.items():
        offsets[name] = total
        nbytes = math.prod(shape) * _DTYPES[_GROUP_ARRAYS[name][0]].itemsize
        total += -(-nbytes // _ALIGN) * _ALIGN
    buf = np.empty(total, dtype=np.uint8)
    cols = {}
    for name, shape in shapes.items():
        dt = _DTYPES[_GROUP_ARRAYS[name][0]]
        n = math.prod(shape)
        cols[name] = buf[offsets[name] : offsets[name] + n * dt.itemsize].view(dt).reshape(shape)
    return buf, cols


def _packed_layout(batch: GroupBatch) -> tuple[Any, list[list]]:
    """(data buffer, specs [name, dtype, shape, byte offset]) of a batch, packing if needed."""
    if batch.buffer is None:
        batch = GroupBatch.from_groups(list(batch), batch.component_names)
    base = np.asarray(batch.buffer)
    start = base.__array_interface__["data"][0]
    specs, end = [], 0
    for name in _GROUP_ARRAYS:
        arr = batch.cols[name]
        # An empty column's pointer is meaningless; place it where the previous one ended.
        off = arr.__array_interface__["data"][0] - start if arr.size else -(-end // _ALIGN) * _ALIGN
        specs.append([name, _GROUP_ARRAYS[name][0], list(arr.shape), off])
        end = off + arr.nbytes
    return batch.buffer, specs


class GroupBatch:
    """K groups in columnar form: what travels on the wire and what the buffer stores.

    Per-group arrays have K rows, per-response arrays R = sum(num_responses) rows and per-token
    arrays T = sum(response_lens) rows. ``group(i)`` returns zero-copy views; offsets are
    computed once, lazily.
    """

    __slots__ = ("_offsets", "buffer", "cols", "component_names", "gen_ids")

    def __init__(
        self,
        gen_ids: list[str],
        cols: dict[str, np.ndarray],
        component_names: list[str],
        buffer: Any = None,
    ):
        self.gen_ids = gen_ids
        self.cols = cols
        self.component_names = component_names
        # The contiguous bytes every column is a view of (None: columns are separate arrays).
        self.buffer = buffer
        self._offsets: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    @classmethod
    def from_groups(cls, groups: Sequence[Group], component_names: Sequence[str]) -> GroupBatch:
        """Concatenate groups into one contiguous buffer (the wire's data frame)."""
        c = len(component_names)
        r = sum(g.num_responses for g in groups)
        per_group = {
            "seqs": [g.seq for g in groups],
            "prompt_ids": [g.prompt_id for g in groups],
            "gen_time_s": [g.gen_time_s for g in groups],
            "prompt_lens": [len(g.prompt_tokens) for g in groups],
            "num_responses": [g.num_responses for g in groups],
        }
        parts = {
            "prompt_tokens": [g.prompt_tokens for g in groups],
            "response_lens": [g.response_lens for g in groups],
            "rewards": [g.rewards for g in groups],
            "acc": [g.acc for g in groups],
            "components": [np.asarray(g.components).reshape(g.num_responses, c) for g in groups],
            "finish": [g.finish for g in groups],
            "tokens": [g.tokens for g in groups],
            "logprobs": [g.logprobs for g in groups],
            "versions": [g.versions for g in groups],
        }
        shapes = {name: (len(groups),) for name in per_group}
        shapes.update({name: (sum(len(x) for x in v),) for name, v in parts.items()})
        shapes["components"] = (r, c)
        buf, cols = _alloc_packed(shapes)
        for name, values in per_group.items():
            cols[name][:] = values
        for name, arrs in parts.items():
            if arrs and cols[name].size:
                np.concatenate(arrs, out=cols[name], casting="unsafe")
        return cls([g.generator_id for g in groups], cols, list(component_names), buf)

    @classmethod
    def empty(cls, component_names: Sequence[str] = ()) -> GroupBatch:
        return cls.from_groups([], component_names)

    def __len__(self) -> int:
        return len(self.gen_ids)

    def __iter__(self):
        return (self.group(i) for i in range(len(self)))

    @property
    def num_tokens(self) -> int:
        return int(self.cols["tokens"].shape[0])

    def offsets(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Start offsets (length K+1) into prompt tokens, responses and response tokens."""
        if self._offsets is None:
            c = self.cols
            p = np.zeros(len(self) + 1, dtype=np.int64)
            np.cumsum(c["prompt_lens"], out=p[1:])
            r = np.zeros(len(self) + 1, dtype=np.int64)
            np.cumsum(c["num_responses"], out=r[1:])
            rt = np.zeros(c["response_lens"].shape[0] + 1, dtype=np.int64)
            np.cumsum(c["response_lens"], out=rt[1:])
            self._offsets = (p, r, rt[r])
        return self._offsets

    def group(self, i: int) -> Group:
        c = self.cols
        p, r, t = self.offsets()
        rs = slice(int(r[i]), int(r[i + 1]))
        ts = slice(int(t[i]), int(t[i + 1]))
        return Group(
            generator_id=self.gen_ids[i],
            seq=int(c["seqs"][i]),
            prompt_id=int(c["prompt_ids"][i]),
            prompt_tokens=c["prompt_tokens"][int(p[i]) : int(p[i + 1])],
            response_lens=c["response_lens"][rs],
            tokens=c["tokens"][ts],
            logprobs=c["logprobs"][ts],
            versions=c["versions"][ts],
            rewards=c["rewards"][rs],
            acc=c["acc"][rs],
            components=c["components"][rs],
            finish=c["finish"][rs],
            gen_time_s=float(c["gen_time_s"][i]),
        )

    def group_ids(self) -> list[GroupId]:
        return list(zip(self.gen_ids, self.cols["seqs"].tolist(), strict=False))

    def select(self, indices: Sequence[int]) -> GroupBatch:
        """A new batch holding the groups at ``indices`` (copies)."""
        return GroupBatch.from_groups([self.group(i) for i in indices], self.component_names)

    def validate(self) -> None:
        """Length consistency, ranges and finiteness; raises ProtocolError."""
        cols, k = self.cols, len(self)
        for name in ("seqs", "prompt_ids", "gen_time_s", "prompt_lens", "num_responses"):
            if cols[name].shape[0] != k:
                raise ProtocolError("length_mismatch", f"len({name}) != number of group ids")
        if k and (cols["prompt_lens"].min() < 1 or cols["num_responses"].min() < 1):
            raise ProtocolError("bad_value", "prompt_lens and num_responses must be >= 1")
        if k and (cols["seqs"].min() < 0 or cols["prompt_ids"].min() < 0):
            raise ProtocolError("bad_value", "seqs and prompt_ids must be >= 0")
        if int(cols["prompt_lens"].sum(dtype=np.int64)) != cols["prompt_tokens"].shape[0]:
            raise ProtocolError("length_mismatch", "sum(prompt_lens) != len(prompt_tokens)")
        r = int(cols["num_responses"].sum(dtype=np.int64))
        for name in ("response_lens", "rewards", "acc", "finish", "components"):
            if cols[name].shape[0] != r:
                raise ProtocolError("length_mismatch", f"len({name}) != sum(num_responses)")
        if cols["components"].shape[1] != len(self.component_names):
            raise ProtocolError("length_mismatch", "components columns != len(component_names)")
        if r and cols["response_lens"].min() < 0:
            raise ProtocolError("bad_value", "response_lens must be >= 0")
        t = int(cols["response_lens"].sum(dtype=np.int64))
        for name in ("tokens", "logprobs", "versions"):
            if cols[name].shape[0] != t:
                raise ProtocolError("length_mismatch", f"len({name}) != sum(response_lens)")
        for name in ("prompt_tokens", "tokens", "versions"):
            if cols[name].size and cols[name].min() < 0:
                raise ProtocolError("bad_value", f"{name} must be >= 0")
        for name in ("rewards", "acc", "components", "gen_time_s"):
            if not np.isfinite(cols[name]).all():
                raise ProtocolError("non_finite", f"{name} holds NaN or inf")
        # max() is NaN when any element is NaN, so one reduction checks both conditions.
        if t and not (
            cols["logprobs"].max() <= LOGPROB_TOLERANCE and np.isfinite(cols["logprobs"].min())
        ):
            raise ProtocolError("non_finite", "logprobs must be finite and <= 0")
        if r and cols["finish"].max() > FINISH_ABORT:
            raise ProtocolError("bad_value", "unknown finish code")


# --------------------------------------------------------------------------- messages


@dataclass
class Message:
    """Base of all messages. Subclasses set KIND; fields typed with plain Python types are
    header fields; groups (if the class has HAS_GROUPS) travel as columnar arrays."""

    KIND: ClassVar[str] = ""
    HAS_GROUPS: ClassVar[bool] = False


@dataclass
class Hello(Message):
    """Generator → buffer, once at start (and after a buffer restart)."""

    KIND: ClassVar[str] = "hello"
    generator_id: str
    pid: int
    engine: str
    host: str = "127.0.0.1"


@dataclass
class Heartbeat(Message):
    """Any role → buffer, periodically; keeps leases alive."""

    KIND: ClassVar[str] = "heartbeat"
    sender: str
    version: int
    outbox_size: int = 0


@dataclass
class LeaseRequest(Message):
    """Generator → buffer: ask for up to ``num_prompts`` prompts."""

    KIND: ClassVar[str] = "lease_request"
    generator_id: str
    num_prompts: int


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


@dataclass
class BatchRequest(Message):
    """Learner rank → buffer: my shard of step ``step``."""

    KIND: ClassVar[str] = "batch_request"
    rank: int
    world_size: int
    step: int


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
class VersionAnnounce(Message):
    """Learner rank 0 → buffer/generators: weights of ``version`` are available."""

    KIND: ClassVar[str] = "version_announce"
    version: int
    manifest_checksum: str
    source: str = "dist"
    path: str = ""


@dataclass
class CheckpointNotice(Message):
    """Learner rank 0 → buffer: a checkpoint after ``step`` is complete (buffer compacts its
    log and frees that step's groups); ``checkpoint_id`` names it in both places."""

    KIND: ClassVar[str] = "checkpoint_notice"
    step: int
    checkpoint_id: str


@dataclass
class Stats(Message):
    """Any role → any role: named scalar metrics."""

    KIND: ClassVar[str] = "stats"
    sender: str
    role: str
    values: dict[str, float] = field(default_factory=dict)


@dataclass
class Shutdown(Message):
    """Any role → any role: stop cleanly."""

    KIND: ClassVar[str] = "shutdown"
    reason: str = ""


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
        VersionAnnounce,
        CheckpointNotice,
        Stats,
        Shutdown,
        RewardRequest,
        RewardReply,
    )
}

_HINTS: dict[str, dict[str, Any]] = {
    kind: {
        f.name: typing.get_type_hints(cls)[f.name]
        for f in dataclasses.fields(cls)
        if f.name != "batch"
    }
    for kind, cls in MESSAGE_TYPES.items()
}


# --------------------------------------------------------------------------- encode / decode


def encode(msg: Message) -> list[Any]:
    """Frames for ``msg``: a msgpack header, then one raw buffer per array (zero-copy)."""
    kind = msg.KIND
    header_fields = {
        name: (list(v) if isinstance(v, tuple) else v)
        for name in _HINTS[kind]
        for v in [getattr(msg, name)]
    }
    if "group_ids" in header_fields:
        header_fields["group_ids"] = [list(g) for g in header_fields["group_ids"]]
    frames: list[Any] = [b""]
    specs: list[list] = []
    if msg.HAS_GROUPS:
        batch: GroupBatch = msg.batch  # type: ignore[attr-defined]
        header_fields["gen_ids"] = batch.gen_ids
        header_fields["component_names"] = batch.component_names
        data, specs = _packed_layout(batch)
        frames.append(data)
    frames[0] = msgpack.packb({"v": SCHEMA_VERSION, "k": kind, "h": header_fields, "a": specs})
    return frames


def _frame_buffer(frame: Any) -> memoryview:
    buf = getattr(frame, "buffer", None)  # zmq.Frame
    return memoryview(buf if buf is not None else frame)


def _reject_ext(code: int, data: bytes) -> Any:
    raise ProtocolError("bad_header", f"msgpack extension type {code} is not allowed")


def decode(frames: Sequence[Any], max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> Message:
    """Validate and decode frames into a Message; raises ProtocolError, never anything else."""
    try:
        return _decode(frames, max_bytes)
    except ProtocolError:
        raise
    except Exception as e:  # any other failure of hostile input is still a protocol error
        raise ProtocolError("malformed", f"{type(e).__name__}: {e}") from None


def _decode(frames: Sequence[Any], max_bytes: int) -> Message:
    if not frames:
        raise ProtocolError("malformed", "no frames")
    if len(frames) > MAX_FRAMES:
        raise ProtocolError("too_large", f"{len(frames)} frames > {MAX_FRAMES}")
    bufs = [_frame_buffer(f) for f in frames]
    total = sum(b.nbytes for b in bufs)
    if total > max_bytes:
        raise ProtocolError("too_large", f"{total} bytes > {max_bytes}")
    if bufs[0].nbytes > MAX_HEADER_BYTES:
        raise ProtocolError("too_large", f"header of {bufs[0].nbytes} bytes")
    try:
        header = msgpack.unpackb(
            bufs[0],
            raw=False,
            strict_map_key=True,
            ext_hook=_reject_ext,
        )
    except ProtocolError:
        raise
    except Exception as e:
        raise ProtocolError("bad_header", f"not msgpack: {type(e).__name__}") from None
    if not isinstance(header, dict) or set(header) != {"v", "k", "h", "a"}:
        raise ProtocolError("bad_header", "header must be a map with keys v, k, h, a")
    if header["v"] != SCHEMA_VERSION:
        raise ProtocolError("bad_version", f"schema version {header['v']!r} != {SCHEMA_VERSION}")
    kind = header["k"]
    if not isinstance(kind, str) or kind not in MESSAGE_TYPES:
        raise ProtocolError("unknown_kind", repr(kind)[:64])
    cls = MESSAGE_TYPES[kind]
    fields_in = header["h"]
    if not isinstance(fields_in, dict):
        raise ProtocolError("bad_header", "h must be a map")
    hints = dict(_HINTS[kind])
    if cls.HAS_GROUPS:
        hints["gen_ids"] = list[str]
        hints["component_names"] = list[str]
    unknown = set(fields_in) - set(hints)
    if unknown:
        raise ProtocolError("bad_field", f"unknown fields {sorted(map(str, unknown))[:5]}")
    values: dict[str, Any] = {}
    defaults = {f.name: f for f in dataclasses.fields(cls)}
    for name, tp in hints.items():
        if name in fields_in:
            values[name] = _check_value(fields_in[name], tp, f"{kind}.{name}")
        elif name in defaults and (
            defaults[name].default is not dataclasses.MISSING
            or defaults[name].default_factory is not dataclasses.MISSING
        ):
            continue
        else:
            raise ProtocolError("bad_field", f"{kind}.{name} missing")
    specs = header["a"]
    if not isinstance(specs, list):
        raise ProtocolError("bad_header", "a must be a list")
    _check_cross_fields(kind, values)
    if cls.HAS_GROUPS:
        if len(bufs) != 2:
            raise ProtocolError("bad_frames", f"{kind} needs a header and one data frame")
        arrays = _decode_arrays(specs, bufs[1])
        batch = GroupBatch(values.pop("gen_ids"), arrays, values.pop("component_names"), bufs[1])
        batch.validate()
        values["batch"] = batch
    elif specs or len(bufs) != 1:
        raise ProtocolError("bad_frames", f"{kind} carries no arrays")
    return cls(**values)


def _decode_arrays(specs: list, data: memoryview) -> dict[str, np.ndarray]:
    """Typed views into the data frame; specs must name the group columns in order, each
    aligned, in bounds and not overlapping the previous one."""
    if len(specs) != len(_GROUP_ARRAYS):
        raise ProtocolError("bad_frames", f"expected {len(_GROUP_ARRAYS)} array specs")
    arrays: dict[str, np.ndarray] = {}
    end = 0
    for spec, (name, (dtype_name, ndim)) in zip(specs, _GROUP_ARRAYS.items(), strict=False):
        if not (isinstance(spec, list) and len(spec) == 4):
            raise ProtocolError("bad_header", "array spec must be [name, dtype, shape, offset]")
        got_name, got_dtype, shape, offset = spec
        if got_name != name:
            raise ProtocolError("bad_frames", f"array {got_name!r} where {name!r} was expected")
        if got_dtype != dtype_name:
            raise ProtocolError("bad_dtype", f"{name} must be {dtype_name}, got {got_dtype!r}")
        if not (
            isinstance(shape, list)
            and len(shape) == ndim
            and all(type(d) is int and d >= 0 for d in shape)
        ):
            raise ProtocolError("bad_shape", f"{name}: shape {shape!r} (needs {ndim} dims)")
        dt = _DTYPES[dtype_name]
        nbytes = math.prod(shape) * dt.itemsize
        if not (type(offset) is int and offset >= end and offset % _ALIGN == 0):
            raise ProtocolError("bad_frames", f"{name}: bad offset {offset!r}")
        if offset + nbytes > data.nbytes:
            raise ProtocolError(
                "bad_frames", f"{name}: {nbytes} bytes at {offset} overrun the frame"
            )
        arrays[name] = np.frombuffer(
            data, dtype=dt, count=nbytes // dt.itemsize, offset=offset
        ).reshape(shape)
        end = offset + nbytes
    return arrays


def _check_cross_fields(kind: str, v: dict[str, Any]) -> None:
    """Length consistency and ranges of header-only messages."""
    if kind == "lease_grant":
        n = len(v["prompt_ids"])
        if not (len(v["prompts"]) == len(v["ground_truths"]) == len(v["data_sources"]) == n):
            raise ProtocolError("length_mismatch", "lease_grant lists differ in length")
        if any(len(p) == 0 or min(p) < 0 for p in v["prompts"]):
            raise ProtocolError("bad_value", "prompts must be non-empty token lists >= 0")
    if kind == "ack" and len(v["group_ids"]) != len(v["statuses"]):
        raise ProtocolError("length_mismatch", "ack group_ids and statuses differ in length")
    for name in ("num_prompts", "step", "rank", "version", "world_size", "outbox_size", "pid"):
        if name in v and v[name] < 0:
            raise ProtocolError("bad_value", f"{kind}.{name} must be >= 0")
    if kind == "batch_request" and not (v["world_size"] >= 1 and v["rank"] < v["world_size"]):
        raise ProtocolError("bad_value", "batch_request needs 0 <= rank < world_size")
    for name in ("wait_s",):
        if name in v and v[name] < 0:
            raise ProtocolError("bad_value", f"{kind}.{name} must be >= 0")
