"""Write-ahead log of the buffer: every state change is appended before it is acknowledged.

File format: a sequence of records ``[u32 length][u8 kind][payload]`` (little-endian).
Kinds: SNAPSHOT (JSON state, first record after a compaction), GROUP (protocol frames of one
group, for a stored group in a snapshot), and EVENT (JSON ``[name, args]`` of a state call;
``ingest`` events carry the group's frames after the JSON). Replaying the events through the
same ``BufferState`` methods rebuilds the exact state.

A record is written with one ``write`` and flushed before the buffer answers, so a SIGKILL of
the buffer loses nothing it acknowledged. A torn final record (killed mid-write) is detected by
its length and cut off at load. ``compact`` writes a snapshot to a new file and renames it over
the log (atomic), at learner checkpoints and whenever the log has grown to twice its size after
the last compaction (``needs_compaction``): a run that never checkpoints keeps a bounded log.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

from dapo_async import protocol

SNAPSHOT, GROUP, EVENT = 1, 2, 3
_HEAD = struct.Struct("<IB")
_FRAMES = struct.Struct("<II")  # header length, data length
# Sanity bound on one record; a larger length field means a corrupt tail.
MAX_RECORD_BYTES = 1 << 30
# A log smaller than this is never compacted for its size (compaction rewrites every stored
# group; below this it costs more than the disk it frees).
COMPACT_MIN_BYTES = 64 << 20


def encode_group(group: protocol.Group, component_names: list[str]) -> bytes:
    frames = protocol.encode(
        protocol.ScoredGroups(batch=protocol.GroupBatch.from_groups([group], component_names))
    )
    header, data = bytes(frames[0]), bytes(memoryview(frames[1]).cast("B"))
    return _FRAMES.pack(len(header), len(data)) + header + data


def decode_group(buf: bytes) -> tuple[protocol.Group, list[str]]:
    hl, dl = _FRAMES.unpack_from(buf)
    off = _FRAMES.size
    msg = protocol.decode([buf[off : off + hl], buf[off + hl : off + hl + dl]])
    return msg.batch.group(0), msg.batch.component_names  # type: ignore[attr-defined]


class WriteAheadLog:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(self.path, "ab")
        self.size = self._f.tell()  # bytes in the log now
        self.compacted_size = self.size  # ... and right after the last compaction

    def _append(self, kind: int, payload: bytes) -> None:
        self._f.write(_HEAD.pack(len(payload), kind) + payload)
        self.size += _HEAD.size + len(payload)

    def needs_compaction(self) -> bool:
        """Grown past COMPACT_MIN_BYTES and to twice its size after the last compaction:
        rewriting it then costs at most what was appended since (amortized O(1) per byte)."""
        return self.size > max(COMPACT_MIN_BYTES, 2 * self.compacted_size)

    def event(self, name: str, args: Any, group_bytes: bytes = b"") -> None:
        js = json.dumps([name, args]).encode()
        self._append(EVENT, struct.pack("<I", len(js)) + js + group_bytes)

    def flush(self) -> None:
        self._f.flush()

    def sync(self) -> None:
        self._f.flush()
        os.fsync(self._f.fileno())

    def compact(self, snapshot: dict, groups: list[bytes]) -> None:
        """Replace the log with a snapshot and the stored groups (atomic rename)."""
        tmp = self.path.with_suffix(".compact")
        with open(tmp, "wb") as f:
            js = json.dumps(snapshot).encode()
            f.write(_HEAD.pack(len(js), SNAPSHOT) + js)
            for g in groups:
                f.write(_HEAD.pack(len(g), GROUP) + g)
            f.flush()
            os.fsync(f.fileno())
            self.size = self.compacted_size = f.tell()
        self._f.close()
        os.replace(tmp, self.path)
        self._f = open(self.path, "ab")

    def close(self) -> None:
        self._f.flush()
        self._f.close()


def read_records(path: str | Path) -> list[tuple[int, bytes]]:
    """All complete records; a torn tail is truncated away."""
    p = Path(path)
    if not p.exists():
        return []
    data = p.read_bytes()
    out, off = [], 0
    while off + _HEAD.size <= len(data):
        length, kind = _HEAD.unpack_from(data, off)
        end = off + _HEAD.size + length
        if length > MAX_RECORD_BYTES or end > len(data) or kind not in (SNAPSHOT, GROUP, EVENT):
            break
        out.append((kind, data[off + _HEAD.size : end]))
        off = end
    if off != len(data):
        with open(p, "r+b") as f:
            f.truncate(off)
    return out


def split_event(payload: bytes) -> tuple[str, Any, bytes]:
    (n,) = struct.unpack_from("<I", payload)
    name, args = json.loads(payload[4 : 4 + n])
    return name, args, payload[4 + n :]
