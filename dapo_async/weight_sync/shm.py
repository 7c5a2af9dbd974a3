"""Same-host weight sync through shared memory: learner rank 0 packs each version into flat
buckets that live in a file under ``/dev/shm`` (a RAM filesystem), and every generator on the
host maps the same file and copies the buckets out. A round is one copy in and one copy out per
receiver — no staging for a socket, no loopback TCP, no process group to form, so a generator that
dies costs nothing and one that starts reads the newest version at once. Where learner and
generators share a GPU the slots can live on it instead (``weight_sync.shm_slots=cuda``: CUDA IPC,
device to device); ``handles.py`` owns both kinds of slot, and everything below is the same for
either.

Two slots, so a version is written while receivers may still read the previous one; the store
(``store.StoreServer``, authenticated with the run's keys, as in dist mode) is the control plane:

    shm/layout  = JSON {slots: [handle, handle], buckets: [[bytes offset, numel, dtype]..],
                        tensors: manifest}           (once per layout)
    shm/writing = round being written                (set before the first byte is written)
    shm/latest  = JSON {round, version, slot, digests}   (set after the last byte)

    publisher                                receiver.poll()
    writing ← r; pack slot r % 2             latest newer than ours? copy slot's buckets out
    digest each bucket; latest ← r           writing ≥ its round + 2 meanwhile? torn: retry
                                             digest the copies; mismatch → WeightSyncError

Round r overwrites the slot of round r − 2, so a copy of round r' is whole unless ``writing``
reached r' + 2 before the copy ended (a seqlock); the digests then check every byte. Files are
named after the run and the learner's store port, reused by a restarted learner, and removed by
``close`` (and by the launcher after a run). Digests are computed where the slot lives (xxh3 on the
host, a word sum on the GPU), and each receiver copies into buffers on that device, so both ends
compute the same kind.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import torch

from dapo_async.config import WeightSyncConfig
from dapo_async.weight_sync.base import WeightPublisher, WeightReceiver, WeightSyncError
from dapo_async.weight_sync.buckets import FlatBuckets, digest
from dapo_async.weight_sync.handles import create_slot, open_slot, settle
from dapo_async.weight_sync.slots import slot_files
from dapo_async.weight_sync.store import STORE_TIMEOUT_S, StoreServer, check_bind, connect_store

log = logging.getLogger(__name__)

# Bucket offsets in a slot file are multiples of this (any dtype's alignment, a cache line).
ALIGN_BYTES = 64
# A receiver whose copy was overwritten mid-way (the learner published twice meanwhile) tries the
# newest version again this many times before giving up until its next poll.
TORN_RETRIES = 3


def _layout(buckets: FlatBuckets) -> tuple[list[list], int]:
    """[[byte offset, numel, dtype name], ...] of each bucket in a slot file, and its size."""
    out, offset = [], 0
    for buf in buckets.buffers:
        out.append([offset, int(buf.numel()), str(buf.dtype).removeprefix("torch.")])
        offset += -(-buf.numel() * buf.element_size() // ALIGN_BYTES) * ALIGN_BYTES
    return out, max(offset, ALIGN_BYTES)


def _bucket_views(raw: torch.Tensor, layout: list[list]) -> list[torch.Tensor]:
    """The buckets of one slot as tensors over its shared memory."""
    out = []
    for offset, numel, dt in layout:
        dtype = getattr(torch, dt)
        out.append(raw[offset : offset + numel * dtype.itemsize].view(dtype))
    return out


class ShmWeightPublisher(WeightPublisher):
    """Learner rank 0 side: ``publish`` packs into the free slot and announces it (module
    docstring); it runs in the learner's thread and takes one copy of the weights."""

    def __init__(
        self,
        ws: WeightSyncConfig,
        run_dir: Path | None,
        host: str = "127.0.0.1",
        wire_dtype: torch.dtype | None = None,
        keys_dir: Path | None = None,
        run_name: str = "run",
        slots: str = "host",
        device=None,
    ):
        from dapo_async.roles import write_endpoint

        check_bind(host, ws, keys_dir)
        self.server = StoreServer(
            host,
            ws.port,
            keys_dir=keys_dir,
            allow_unauthenticated_network=ws.allow_unauthenticated_network,
        )
        self.store = self.server.local(STORE_TIMEOUT_S)
        self.endpoint = f"{host}:{self.server.port}"
        if run_dir is not None:
            write_endpoint(run_dir, "wsync", self.endpoint)
        self.run_dir = run_dir
        self.files = slot_files(run_dir, f"{run_name}-{self.server.port}")
        self.bucket_bytes = ws.bucket_mb << 20
        self.wire_dtype = wire_dtype
        self.layout: FlatBuckets | None = None
        self.slot_kind = slots
        self.device = device
        self.raw: list[torch.Tensor] = []  # the two slots; kept alive while receivers map them
        self.slots: list[list[torch.Tensor]] = []
        self.round = -1
        self.sent_version = -1
        self.stats = {"rounds": 0, "bytes": 0, "seconds": 0.0}

    def publish(self, state_dict: dict, version: int) -> None:
        shapes = [(k, t.shape, t.dtype) for k, t in state_dict.items()]
        self.publish_stream(shapes, iter(state_dict.items()), version)

    def publish_stream(self, shapes, items, version: int) -> None:
        t0 = time.monotonic()
        if self.layout is None:
            self._allocate(list(shapes))
        self.round += 1
        slot = self.round % 2
        self.store.set("shm/writing", str(self.round))
        self.layout.buffers = self.slots[slot]
        self.layout.pack_items(items)  # copies from the learner's device into the slot
        digests = [digest(b) for b in self.layout.buffers]
        settle(self.raw[slot])
        latest = {"round": self.round, "version": version, "slot": slot, "digests": digests}
        self.store.set("shm/latest", json.dumps(latest))
        self.sent_version = version
        self.stats["rounds"] += 1
        self.stats["bytes"] += sum(b.numel() * b.element_size() for b in self.layout.buffers)
        self.stats["seconds"] += time.monotonic() - t0

    def _allocate(self, shapes: list) -> None:
        # the layout (names, dtypes, bucket sizes) as dist mode's; its buffers are replaced by
        # views into the slot files
        self.layout = FlatBuckets(shapes, self.bucket_bytes, "meta", self.wire_dtype)
        buckets, size = _layout(self.layout)
        self.files[0].parent.mkdir(parents=True, exist_ok=True)
        made = [create_slot(self.slot_kind, f, size, self.device) for f in self.files]
        self.raw = [raw for raw, _ in made]
        self.slots = [_bucket_views(raw, buckets) for raw in self.raw]
        manifest = self.layout.manifest(-1)
        layout = {
            "slots": [handle for _, handle in made],
            "size": size,
            "buckets": buckets,
            "tensors": manifest["tensors"],
        }
        self.store.set("shm/layout", json.dumps(layout))

    def wait_sent(self, version: int, timeout_s: float) -> bool:
        """Published is sent: receivers read the slot when they poll."""
        return self.sent_version >= version

    def close(self) -> None:
        self.slots, self.raw = [], []
        for f in self.files:
            f.unlink(missing_ok=True)
        self.store = None
        self.server.close()


class ShmWeightReceiver(WeightReceiver):
    """Generator side: ``poll`` copies a newer version out of its slot and verifies it."""

    def __init__(
        self,
        ws: WeightSyncConfig,
        run_dir: Path | None,
        receiver_id: str,
        endpoint: str | None = None,
        connect_timeout_s: float = STORE_TIMEOUT_S,
        keys_dir: Path | None = None,
    ):
        self.id = receiver_id
        _, self.store = connect_store(ws, run_dir, endpoint, keys_dir, connect_timeout_s)
        self.layout_text = ""
        self.slots: list[list[torch.Tensor]] = []
        self.buckets: FlatBuckets | None = None
        self.round = -1
        self.version = -1
        self.stats = {"rounds": 0, "torn": 0, "seconds": 0.0}

    def poll(self) -> tuple[dict[str, torch.Tensor], int] | None:
        for _ in range(TORN_RETRIES):
            if not self.store.check(["shm/latest"]):
                return None
            latest = json.loads(self.store.get("shm/latest"))
            if latest["round"] <= self.round:
                return None
            if self._copy(latest):
                return self.buckets.views(), self.version
            self.stats["torn"] += 1
        return None

    def _copy(self, latest: dict) -> bool:
        """Copy ``latest``'s slot into our buffers; False when it was overwritten meanwhile."""
        t0 = time.monotonic()
        self._ensure_layout()
        for dst, src in zip(self.buckets.buffers, self.slots[latest["slot"]]):
            dst.copy_(src)
        settle(self.buckets.buffers[0])
        if int(self.store.get("shm/writing")) >= latest["round"] + 2:
            return False  # the learner began rewriting this slot during the copy
        got = [digest(b) for b in self.buckets.buffers]
        if got != latest["digests"]:
            bad = [i for i, (a, b) in enumerate(zip(got, latest["digests"])) if a != b]
            raise WeightSyncError(
                f"weight-sync checksum mismatch in shared-memory round {latest['round']} "
                f"(version {latest['version']}, buckets {bad}); keeping v{self.version}"
            )
        self.round, self.version = latest["round"], int(latest["version"])
        self.stats["rounds"] += 1
        self.stats["seconds"] += time.monotonic() - t0
        return True

    def _ensure_layout(self) -> None:
        text = self.store.get("shm/layout").decode()
        if text == self.layout_text:
            return
        layout = json.loads(text)
        raw = [open_slot(handle) for handle in layout["slots"]]
        self.slots = [_bucket_views(r, layout["buckets"]) for r in raw]
        manifest = {
            "tensors": layout["tensors"],
            "buckets": [[numel, dt] for _, numel, dt in layout["buckets"]],
        }
        # the copies live where the slot does: device to device on a shared GPU, and the digests
        # are then the same kind as the learner's
        self.buckets = FlatBuckets.from_manifest(manifest, device=raw[0].device)
        self.layout_text = text

    def close(self) -> None:
        self.slots = []
        self.store.close()
