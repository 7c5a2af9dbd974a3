"""The generator side of dist weight sync (``dist.py`` has the protocol and the sender): join
through the store, keep a heartbeat, form each epoch's group the moment it is announced, take
part in each round of the current epoch, verify every bucket's digest, and hand back a state
dict of views into the received buckets.

    former thread (every FORM_POLL_S): a newer epoch with us in it? → a thread of its own
            builds its group, bounded by weight_sync.form_timeout_s (a failed formation: we
            join the next epoch); a formation that overruns never delays the next one
    poll(): no newer round (one store request)? → None
            its epoch's group still forming? → None (the round is taken at a later poll)
            receive the buckets (digesting each as the next arrives) → compare digests
            → (state, version) | WeightSyncError (previous weights kept)
            | None when the sender abandoned the round: a collective failed, or it announced
              a newer epoch (asked every ABANDON_POLL_S while the round waits; we join that one)

Forming from a thread keeps formation short whatever the generator is doing (a long batch, a
vLLM step): every live member joins within FORM_POLL_S, so the sender can bound formation
tightly, and a member that dies while the group forms costs the others that bound, not a
collective timeout. Each epoch forms in a thread of its own because gloo can take far longer
than its timeout to give up on a dead member (60 s seen on a loaded 2-core machine, against a
10 s bound): one former thread stuck in it would come to every later epoch after the sender had
abandoned it, and never join again.
"""

from __future__ import annotations

import json
import logging
import threading
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

# The former thread looks for a newly announced epoch this often: two store requests each, on
# the learner's store thread, per receiver (every vLLM worker is one): small against
# weight_sync.form_timeout_s, and few requests beside the 1 s heartbeats.
FORM_POLL_S = 0.2


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
        self.form_timeout_s = ws.form_timeout_s
        self.epoch = -1
        self.rank = -1
        self.pg = None
        self.last = (-1, -1)
        self.version = -1
        self.buckets: FlatBuckets | None = None
        # epoch -> (rank, group | None when its formation failed), filled by formation threads
        self._formed: dict[int, tuple[int, object]] = {}
        self._adopted = -1  # newest epoch adopted: a formation of an older one is discarded
        self._closed = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._former = threading.Thread(target=self._form_loop, name="wsync-form", daemon=True)
        self._former.start()

    def pending(self) -> bool:
        """Whether a round newer than the last one taken is open. One store request: a
        generator asks before every decode chunk, and each request waits for the learner's
        store thread (three a chunk, with a heartbeat the ``Heartbeat`` thread already sends and
        a ``check`` before the ``get``, held the generator ~6% of its time on a loaded 2-core
        machine)."""
        return self.latest() > self.last

    def latest(self) -> tuple[int, int]:
        """The newest announced (epoch, round); (-1, -1) before the first."""
        raw = self.store.peek("latest")
        return (-1, -1) if raw is None else tuple(json.loads(raw))

    # ------------------------------------------------------------------ former thread

    def _form_loop(self) -> None:
        formed_up_to = -1
        while not self._stop.wait(FORM_POLL_S):
            try:
                e = self.latest()[0]
                if e <= formed_up_to:
                    continue
                formed_up_to = e
                members = json.loads(self.store.get(f"epoch/{e}"))
            except Exception:  # the store went away: poll() reports it
                continue
            if self.id in members:
                args = (e, members.index(self.id) + 1, len(members) + 1)
                threading.Thread(
                    target=self._form, args=args, name=f"wsync-form-{e}", daemon=True
                ).start()

    def _form(self, e: int, rank: int, size: int) -> None:
        try:
            pg, _ = make_group(
                self.store, e, rank, size, self.timeout_s, self.backend, self.form_timeout_s
            )
        except Exception as err:  # a member died while it formed: the sender re-forms
            first = (str(err).splitlines() or [type(err).__name__])[0]
            log.warning("weight-sync epoch %d did not form (%s)", e, first[:120])
            pg = None
        with self._lock:
            if not (self._closed or e <= self._adopted):
                self._formed[e] = (rank, pg)
                return
        close_group(pg, self.backend)  # overran: a newer epoch is ours, or we closed

    def ready(self, at: tuple[int, int]) -> bool:
        """Whether ``poll(at)`` would return at once: False only while the group of ``at``'s
        epoch, which includes us, is still forming (tensor-parallel workers all wait for
        True before any enters the round's collectives)."""
        e = at[0]
        if e < 0 or e == self.epoch or tuple(at) <= self.last:
            return True
        with self._lock:
            if e in self._formed:
                return True
        return self.id not in json.loads(self.store.get(f"epoch/{e}"))

    def _adopt(self, e: int) -> bool:
        """Make epoch ``e``'s formed group ours (closing older ones); False when we are no
        member of it, its formation failed, or it is still forming."""
        with self._lock:
            got = self._formed.get(e)
            if got is None:
                return False
            stale = sorted(k for k in self._formed if k <= e)
            groups = [self._formed.pop(k)[1] for k in stale]
            self._adopted = max(self._adopted, e)
        close_group(self.pg, self.backend)
        for g in groups[:-1]:
            close_group(g, self.backend)
        self.rank, self.pg = got
        self.epoch = e if self.pg is not None else -1
        return self.pg is not None

    # ------------------------------------------------------------------ rounds

    def poll(self, at: tuple[int, int] | None = None) -> tuple[dict[str, torch.Tensor], int] | None:
        """Take part in round ``at`` (the newest when None). Tensor-parallel workers of one
        engine are given the same ``at``, read once by their generator: each reading "latest" on
        its own could see different rounds and wait in different collectives."""
        if at is None:
            if not self.pending():
                return None
            at = self.latest()
        e, r = at
        if tuple(at) <= self.last or e < 0:
            return None
        if e != self.epoch:
            if not self.ready(at):
                return None  # still forming: this round is taken at a later poll
            if not self._adopt(e):
                self.last = (e, r)  # not for us: we join the next epoch
                return None
        manifest = json.loads(self.store.get(f"round/{e}/{r}"))
        self.last = (e, r)
        self._ensure_buffers(manifest)
        try:
            works = [self.pg.broadcast(buf, 0) for buf in self.buckets.buffers]
            got = []  # digest bucket i (on the host's word that it arrived) while i + 1 arrives
            wait_all(
                works,
                self.timeout_s,
                lambda i: got.append(digest(self.buckets.buffers[i])),
                abandoned=lambda: self.latest()[0] > e,
            )
        except RuntimeError as err:  # the sender abandoned the round (a member died)
            log.warning("weight-sync round %d failed (%s); joining the next one", r, str(err)[:120])
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
        self._stop.set()
        self._former.join(timeout=self.form_timeout_s + 1)
        self.heartbeat.close()
        close_group(self.pg, self.backend)
        with self._lock:
            self._closed = True  # formations still running close their group when done
            for _, g in self._formed.values():
                close_group(g, self.backend)
            self._formed.clear()
        self.store.close()
