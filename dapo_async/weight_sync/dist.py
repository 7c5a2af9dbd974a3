"""Weight sync over a torch.distributed group separate from the training world.

Learner rank 0 hosts the store (``store.StoreServer``: authenticated with the run's CurveZMQ
keys); generators connect to it (no ``init_process_group``) and all members build
``ProcessGroupGloo`` (NCCL on GPUs) from ``PrefixStore("wsync/<epoch>", store)``. Other learner
ranks never touch it. Store keys (control plane):

    join/<n> = receiver id          (a receiver registers; n from the atomic counter "joins")
    alive/<id> = unix time          (refreshed every second by each receiver's heartbeat thread)
    epoch/<e> = JSON member ids     (member i has group rank i + 1; the sender is rank 0)
    round/<e>/<r> = JSON manifest   (version, names, shapes, dtypes, bucket sizes)
    digests/<e>/<r> = JSON list     (one 64-bit digest per bucket, posted during the transfer)
    latest = JSON [e, r]

Rounds are sequential and every member of the epoch takes part in each, so a receiver is at
most one round behind. The sender runs rounds in a background thread (the learner never waits
for a slow generator); each round sends the newest snapshot. ``publish`` copies the weights into
a staging set of flat buckets; the sender swaps staging and sending sets at the start of a round
(no second copy), posts each bucket's broadcast and digests it (xxh3-64 on CPU, about 10 GB/s)
while it is on the wire, then posts the digests; the receiver digests bucket i while bucket i + 1
is still arriving and compares at the end. A failed round (a receiver died: gloo reports the
closed connection at once; or a collective times out) raises in the thread: the sender closes
the group, so the survivors' pending receive fails too instead of waiting out the timeout, and
re-forms it (new epoch) with the members whose heartbeat came after the failure (a member that
dies while a group forms fails the formation within ``weight_sync.form_timeout_s``: receivers
form from a thread the moment an epoch is announced, ``dist_receiver``), and a receiver that joined or restarted is included at the next epoch and gets the current
weights in its first round. Receivers verify every bucket's digest and the names/shapes against
their own model; a mismatch raises ``WeightSyncError`` and keeps the previous weights.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path

import torch

from dapo_async.config import WeightSyncConfig
from dapo_async.devices import record_event, side_stream, use_stream, wait_event
from dapo_async.weight_sync.base import WeightPublisher
from dapo_async.weight_sync.buckets import FlatBuckets, digest
from dapo_async.weight_sync.collectives import (
    FORM_SLACK_S,
    close_group,
    form_within,
    group_device,
    make_group,
    wait_all,
)
from dapo_async.weight_sync.store import STORE_TIMEOUT_S, StoreServer, check_bind

log = logging.getLogger(__name__)

# A receiver that has not refreshed alive/<id> for this long is left out of the next epoch
# (receivers refresh it every liveness.HEARTBEAT_S from a thread of their own).
ALIVE_TIMEOUT_S = 5.0
# After a failed round (a receiver died mid-round), wait this long and re-form with the
# receivers whose heartbeat came after the failure: two beats (liveness.HEARTBEAT_S).
REFORM_AFTER_FAILURE_S = 2.5
# Rounds whose manifest and digests stay in the store (a member is at most one round behind).
KEEP_ROUNDS = 2
# Idle sender thread wakes up this often to look for new members.
SENDER_POLL_S = 0.2


def default_backend() -> str:
    """NCCL where this process has a GPU, gloo otherwise (both ends must agree: a mixed
    CPU/GPU deployment sets ``weight_sync.backend`` explicitly, or uses ``mode=disk``)."""
    return "nccl" if torch.cuda.is_available() else "gloo"


class DistWeightPublisher(WeightPublisher):
    """Learner rank 0 side. ``publish`` snapshots the weights and returns at once."""

    def __init__(
        self,
        ws: WeightSyncConfig,
        run_dir: Path | None,
        host: str = "127.0.0.1",
        port: int | None = None,
        backend: str = "gloo",
        wire_dtype: torch.dtype | None = None,
        keys_dir: Path | None = None,
    ):
        from dapo_async.roles import write_endpoint

        self.host = host
        check_bind(host, ws, keys_dir)
        # the rendezvous: our own store (authenticated with the run's keys), on host only
        self.server = StoreServer(
            host,
            port if port is not None else ws.port,
            keys_dir=keys_dir,
            allow_unauthenticated_network=ws.allow_unauthenticated_network,
        )
        self.port = self.server.port
        self.timeout_s = ws.timeout_s
        self.form_timeout_s = ws.form_timeout_s
        self.bucket_bytes = ws.bucket_mb << 20
        self.backend = backend
        self.device = group_device(backend)
        self.wire_dtype = wire_dtype  # floating tensors travel (and are staged) in this dtype
        # the sender's collectives run on a stream of their own: waits never land on the
        # learner's compute stream (None on CPU)
        self.stream = side_stream(self.device)
        self.staged_event = self.bucket_event = None  # CUDA: the staging copy is done
        self.store = self.server.local(STORE_TIMEOUT_S)
        self.store.set("joins", "0")
        self.endpoint = f"{self.host}:{self.port}"
        if run_dir is not None:
            write_endpoint(run_dir, "wsync", self.endpoint)
        self.buckets: FlatBuckets | None = None
        self.staged: FlatBuckets | None = None
        self.staged_version = -1
        self.bucket_version = -1  # the version held in self.buckets (being or last sent)
        self.round_started_at = 0.0
        self.sent_version = -1
        self.epoch = -1
        self.round = -1
        self.members: list[str] = []
        self.known: list[str] = []
        self.failed_at = 0.0  # wall time of the last failed round (liveness counts after it)
        self.pg = None
        self.errors = 0
        self.stats = {"rounds": 0, "bytes": 0, "seconds": 0.0, "reforms": 0}
        self._cv = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="wsync-sender", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ learner thread

    def publish(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        with self._cv:
            self._allocate([(k, v.shape, v.dtype) for k, v in state_dict.items()])
            self.staged.pack(state_dict)
            self._staged(version)

    def publish_stream(self, shapes, items, version: int) -> None:
        """Like ``publish``, from (name, tensor) pairs copied in one at a time (an FSDP2
        learner gathers each full tensor, hands it over and frees it)."""
        with self._cv:
            self._allocate(list(shapes))
            self.staged.pack_items(items)
            self._staged(version)

    def _staged(self, version: int) -> None:
        # the copies were queued on the learner's stream: the sender waits for this event
        self.staged_event = record_event()
        self.staged_version = version
        self._cv.notify()

    def _allocate(self, shapes: list) -> None:
        if self.staged is None:
            self.staged = FlatBuckets(shapes, self.bucket_bytes, self.device, self.wire_dtype)
            self.buckets = FlatBuckets(shapes, self.bucket_bytes, self.device, self.wire_dtype)

    def wait_sent(self, version: int, timeout_s: float) -> bool:
        """Block until ``version`` (or newer) reached every member (tests, shutdown)."""
        deadline = time.monotonic() + timeout_s
        with self._cv:
            while self.sent_version < version and time.monotonic() < deadline:
                self._cv.wait(0.05)
            return self.sent_version >= version

    def close(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify()
        self._thread.join(timeout=self.timeout_s + 5)
        close_group(self.pg, self.backend)
        self.server.close()

    # ------------------------------------------------------------------ sender thread

    def _alive_members(self) -> list[str]:
        n = int(self.store.get("joins"))
        for i in range(len(self.known), n):
            rid = self.store.get(f"join/{i + 1}").decode()
            if rid not in self.known:
                self.known.append(rid)
        now = time.time()
        alive = []
        for rid in self.known:
            try:
                t = float(self.store.get(f"alive/{rid}"))
            except Exception:
                continue
            if now - t < ALIVE_TIMEOUT_S and t > self.failed_at:
                alive.append(rid)
        return alive

    def _new_epoch(self, members: list[str]) -> None:
        """Announce a new member list; the group itself is built once the round is announced
        (building it is a rendezvous the receivers join when they see the round)."""
        close_group(self.pg, self.backend)
        self.pg = None
        self.epoch += 1
        self.members = members
        self.store.set(f"epoch/{self.epoch}", json.dumps(members))
        self.stats["reforms"] += 1
        log.info("weight-sync epoch %d with %d receivers", self.epoch, len(members))

    def _run(self) -> None:
        while True:
            with self._cv:
                while (
                    not self._stop
                    and self.staged_version <= self.sent_version
                    and not self._membership_changed()
                ):
                    self._cv.wait(SENDER_POLL_S)
                if self._stop:
                    return
                if self.staged is None:
                    continue
                if self.staged_version > self.bucket_version:
                    # the previous round is over: its buffers become the next staging set
                    self.buckets, self.staged = self.staged, self.buckets
                    self.bucket_version = self.staged_version
                    self.bucket_event = self.staged_event
                version = self.bucket_version
            try:
                self._send_round(version)
            except Exception as e:  # a dead or slow receiver: re-form at the next round
                self.errors += 1
                log.warning(
                    "weight-sync round failed (%s); re-forming the group",
                    str(e).splitlines()[0][:200],
                )
                # close the group now (the survivors' pending receive fails instead of waiting
                # out the timeout) and re-form with the members that beat after the failure
                close_group(self.pg, self.backend)
                self.pg = None
                self.members = []
                self.failed_at = time.time()
                time.sleep(REFORM_AFTER_FAILURE_S)

    def _membership_changed(self) -> bool:
        try:
            alive = self._alive_members()
        except Exception:
            return False
        return sorted(alive) != sorted(self.members)

    def _form(self):
        """This epoch's group (rank 0). Gloo's formation is bounded from a thread of its own:
        it can overrun its timeout by far when a member died after posting its address (NCCL's
        returns at once: its communicator is non-blocking)."""
        size = len(self.members) + 1

        def build():
            return make_group(
                self.store, self.epoch, 0, size, self.timeout_s, self.backend, self.form_timeout_s
            )

        if self.backend == "nccl":
            return build()
        bound = self.form_timeout_s + FORM_SLACK_S
        return form_within(build, bound, lambda built: close_group(built[0], self.backend))

    def _send_round(self, version: int) -> None:
        alive = self._alive_members()
        if sorted(alive) != sorted(self.members) or self.pg is None:
            self._new_epoch(alive)
        if not self.members:
            with self._cv:
                self.sent_version = version  # nobody to send to
                self._cv.notify_all()
            return
        self.round += 1
        t0 = time.monotonic()
        self.round_started_at = time.time()  # wall clock, for benchmarks across processes
        manifest = self.buckets.manifest(version)
        self.store.set(f"round/{self.epoch}/{self.round}", json.dumps(manifest))
        # every member takes part in every round of its epoch, so none still reads the keys
        # of two rounds back: drop them (the store would otherwise grow by a manifest a round)
        self.store.delete_key(f"round/{self.epoch}/{self.round - KEEP_ROUNDS}")
        self.store.delete_key(f"digests/{self.epoch}/{self.round - KEEP_ROUNDS}")
        self.store.set("latest", json.dumps([self.epoch, self.round]))
        if self.pg is None:
            self.pg, _ = self._form()
        works, digests = [], []
        with use_stream(self.stream):
            wait_event(self.bucket_event, self.stream)
            for buf in self.buckets.buffers:  # digest bucket i while it is on the wire
                works.append(self.pg.broadcast(buf, 0))
                digests.append(digest(buf))
        self.store.set(f"digests/{self.epoch}/{self.round}", json.dumps(digests))
        wait_all(works, self.timeout_s)
        self.stats["rounds"] += 1
        self.stats["bytes"] += sum(b.numel() * b.element_size() for b in self.buckets.buffers)
        self.stats["seconds"] += time.monotonic() - t0
        with self._cv:
            self.sent_version = version
            self._cv.notify_all()
