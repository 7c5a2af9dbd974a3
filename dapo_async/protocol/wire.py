"""The wire format: ``encode`` a message into ZeroMQ frames, ``decode`` and validate frames
into a message (see the package docstring for the layout). ``decode`` raises ``ProtocolError``
and nothing else, whatever the input."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import msgpack
import numpy as np

from dapo_async.protocol.checks import ProtocolError, check_value
from dapo_async.protocol.groups import ALIGN, DTYPES, GROUP_ARRAYS, GroupBatch, packed_layout
from dapo_async.protocol.messages import HINTS, MESSAGE_TYPES, Message

# Header schema version, bumped on any incompatible change to a message (2: the heartbeat names
# its generator `generator_id`, as every generator message does; it was `sender`. 3: groups
# carry a per-token `sampled` column, environment tokens of multi-turn episodes at 0).
SCHEMA_VERSION = 3
# A header is a few hundred bytes; 4 MiB leaves room for a batch of thousands of group ids.
MAX_HEADER_BYTES = 4 << 20
# Default bound on one message (all frames); a step batch of a large model fits well inside.
DEFAULT_MAX_MESSAGE_BYTES = 256 << 20
# Frames per message: a header, plus one data frame for messages that carry groups.
MAX_FRAMES = 2


def encode(msg: Message) -> list[Any]:
    """Frames for ``msg``: a msgpack header, then one raw buffer per array (zero-copy)."""
    kind = msg.KIND
    header_fields = {
        name: (list(v) if isinstance(v, tuple) else v)
        for name in HINTS[kind]
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
        data, specs = packed_layout(batch)
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
    bufs = _frame_buffers(frames, max_bytes)
    header = _read_header(bufs[0])
    kind = header["k"]
    cls = MESSAGE_TYPES[kind]
    values = _read_fields(cls, header["h"])
    specs = header["a"]
    if not isinstance(specs, list):
        raise ProtocolError("bad_header", "a must be a list")
    if cls.HAS_GROUPS:
        if len(bufs) != 2:
            raise ProtocolError("bad_frames", f"{kind} needs a header and one data frame")
        arrays = _decode_arrays(specs, bufs[1])
        batch = GroupBatch(values.pop("gen_ids"), arrays, values.pop("component_names"), bufs[1])
        batch.validate()
        values["batch"] = batch
    elif specs or len(bufs) != 1:
        raise ProtocolError("bad_frames", f"{kind} carries no arrays")
    msg = cls(**values)
    msg.validate()
    return msg


def _frame_buffers(frames: Sequence[Any], max_bytes: int) -> list[memoryview]:
    """The frames as buffers, within the frame-count and size limits."""
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
    return bufs


def _read_header(buf: memoryview) -> dict:
    """The msgpack header map {v, k, h, a}, with a known schema version and message kind."""
    try:
        header = msgpack.unpackb(buf, raw=False, strict_map_key=True, ext_hook=_reject_ext)
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
    if not isinstance(header["h"], dict):
        raise ProtocolError("bad_header", "h must be a map")
    return header


def _read_fields(cls: type[Message], fields_in: dict) -> dict[str, Any]:
    """Header fields type-checked against the message class; unknown or missing ones fail."""
    kind = cls.KIND
    hints = dict(HINTS[kind])
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
            values[name] = check_value(fields_in[name], tp, f"{kind}.{name}")
            continue
        f = defaults.get(name)
        has_default = f is not None and (
            f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        )
        if not has_default:
            raise ProtocolError("bad_field", f"{kind}.{name} missing")
    return values


def _decode_arrays(specs: list, data: memoryview) -> dict[str, np.ndarray]:
    """Typed views into the data frame; specs must name the group columns in order, each
    aligned, in bounds and not overlapping the previous one."""
    if len(specs) != len(GROUP_ARRAYS):
        raise ProtocolError("bad_frames", f"expected {len(GROUP_ARRAYS)} array specs")
    arrays: dict[str, np.ndarray] = {}
    end = 0
    for spec, (name, (dtype_name, ndim)) in zip(specs, GROUP_ARRAYS.items(), strict=False):
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
        dt = DTYPES[dtype_name]
        nbytes = math.prod(shape) * dt.itemsize
        if not (type(offset) is int and offset >= end and offset % ALIGN == 0):
            raise ProtocolError("bad_frames", f"{name}: bad offset {offset!r}")
        if offset + nbytes > data.nbytes:
            raise ProtocolError(
                "bad_frames", f"{name}: {nbytes} bytes at {offset} overrun the frame"
            )
        arrays[name] = np.frombuffer(
            data, dtype=dt, count=nbytes // dt.itemsize, offset=offset
        ).reshape(shape)
        end = offset + nbytes
    if data.nbytes != -(-end // ALIGN) * ALIGN:  # a cut that took only padding is a cut too
        raise ProtocolError(
            "bad_frames", f"data frame is {data.nbytes} bytes; its arrays end at {end}"
        )
    return arrays
