"""The generator side of dist weight sync (``dist.py`` has the protocol and the sender): join
through the store, keep a heartbeat, take part in each round of the current epoch, verify every
bucket's digest, and hand back a state dict of views into the received buckets.

    poll(): heartbeat ─ no newer round? → None
            new epoch with us in it? → build the group (rank = position + 1)
            receive the buckets (digesting each as the next arrives) → compare digests
            → (state, version) | WeightSyncError (previous weights kept)
            | None when the sender abandoned the round (we join the next epoch)
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import torch

from dapo_async.config import WeightSyncConfig
from dapo_async.weight_sync.base import WeightReceiver, WeightSyncError
from dapo_async.weight_sync.buckets import FlatBuckets, digest
from dapo_async.weight_sync.collectives import close_group, group_device, make_group, wait_all
from dapo_async.weight_sync.liveness import Heartbeat
from dapo_async.weight_sync.store import STORE_TIMEOUT_S, connect_store

log = logging.getLogger(__name__)


class DistWeightReceiver(WeightReceiver):
    """Generator side. ``poll()`` returns (state dict, version) when a round for it is open."""

    def __init__(
        self,
        ws: WeightSyncConfig,
        run_dir: Path | None,
        receiver_id: str,
        endpoint: str | None = None,
        backend: str = "gloo",
        connect_timeout_s: float = STORE_TIMEOUT_S,
        keys_dir: Path | None = None,
    ):
        self.id = receiver_id
        self.timeout_s = ws.timeout_s
        self.backend = backend
        self.device = group_device(backend)

        def register(store) -> None:
            store.set(f"alive/{self.id}", str(time.time()))
            store.set(f"join/{store.add('joins', 1)}", self.id)

        ep, self.store = connect_store(ws, run_dir, endpoint, keys_dir, connect_timeout_s, register)
        self.heartbeat = Heartbeat(ep, keys_dir, self.id, STORE_TIMEOUT_S)
        self.epoch = -1
        self.rank = -1
        self.pg = None
        self.last = (-1, -1)
        self.version = -1
        self.buckets: FlatBuckets | None = None

    def _heartbeat(self) -> None:
        self.store.set(f"alive/{self.id}", str(time.time()))

    def pending(self) -> bool:
        """Whether a round newer than the last one taken is open (heartbeats too)."""
        self._heartbeat()
        return self.latest() > self.last

    def latest(self) -> tuple[int, int]:
        """The newest announced (epoch, round); (-1, -1) before the first."""
        if not self.store.check(["latest"]):
            return (-1, -1)
        return tuple(json.loads(self.store.get("latest")))

    def poll(self, at: tuple[int, int] | None = None) -> tuple[dict[str, torch.Tensor], int] | None:
        """Take part in round ``at`` (the newest when None). Tensor-parallel workers of one
        engine are given the same ``at``, read once by their generator: each reading "latest" on
        its own could see different rounds and wait in different collectives."""
        if at is None:
            if not self.pending():
                return None
            at = self.latest()
        else:
            self._heartbeat()
        e, r = at
        if tuple(at) <= self.last or e < 0:
            return None
        if e != self.epoch:
            members = json.loads(self.store.get(f"epoch/{e}"))
            if self.id not in members:
                return None  # joins at the next epoch
            close_group(self.pg, self.backend)
            self.rank = members.index(self.id) + 1
            self.pg, _ = make_group(
                self.store, e, self.rank, len(members) + 1, self.timeout_s, self.backend
            )
            self.epoch = e
        manifest = json.loads(self.store.get(f"round/{e}/{r}"))
        self.last = (e, r)
        self._ensure_buffers(manifest)
        try:
            works = [self.pg.broadcast(buf, 0) for buf in self.buckets.buffers]
            got = []  # digest bucket i (on the host's word that it arrived) while i + 1 arrives
            wait_all(works, self.timeout_s, lambda i: got.append(digest(self.buckets.buffers[i])))
        except RuntimeError as e:  # the sender abandoned the round (a member died)
            log.warning("weight-sync round %d failed (%s); joining the next one", r, str(e)[:120])
            self._leave_group()
            return None
        # the sender posts the digests once it has computed them (during the transfer)
        want = json.loads(self.store.get(f"digests/{e}/{r}"))
        bad = [i for i in range(max(len(got), len(want))) if got[i : i + 1] != want[i : i + 1]]
        if bad:
            raise WeightSyncError(
                f"weight-sync checksum mismatch in round {r} (version {manifest['version']}, "
                f"buckets {bad}); keeping v{self.version}"
            )
        self.version = int(manifest["version"])
        return self.buckets.views(), self.version

    def _ensure_buffers(self, manifest: dict) -> None:
        want = [
            (n, b, off, tuple(shape), getattr(torch, dt))
            for n, b, off, shape, dt in manifest["tensors"]
        ]
        for n, b, off, shape, _ in want:
            size, _dt = manifest["buckets"][b]
            if not (off >= 0 and off + int(torch.Size(shape).numel()) <= int(size)):
                raise WeightSyncError(f"weight-sync manifest places {n} outside its bucket")
        if self.buckets is None or [tuple(x) for x in self.buckets.layout] != want:
            self.buckets = FlatBuckets.from_manifest(manifest, self.device)

    def _leave_group(self) -> None:
        close_group(self.pg, self.backend)
        self.pg, self.epoch = None, -1

    def close(self) -> None:
        self.heartbeat.close()
        close_group(self.pg, self.backend)
        self.store.close()
