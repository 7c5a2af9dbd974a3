"""Cores follow the work: roles that share a machine lend their torch threads while they wait.

Each role on a host (the learner, each generator) holds a ``CoreShare`` over one small record
file in ``<run_dir>/cores/`` (host name, pid, threads it owns, whether and since when it is
waiting, its recent idle ratio). A role marks itself waiting when it blocks for the other side (the learner
for its batch, a generator for a lease or for weights) and working when it has compute to do;
at each working mark (and before every forward of the modules it ``watch``es) it takes its own
threads plus a share of the threads of every role on the same host that has been waiting for
``MIN_LEND_WAIT_S`` *and* whose recent idle ratio is above ``lend_idle_above`` (a role that
waits only now and then keeps its core: a role about to wake up would find it taken).

    learner:    waiting() ── fetch batch ── working() ── train step ── observe_idle(wait/step)
    generator:  waiting() ── lease / weights ── working() ── decode chunk(s) ── observe_idle(..)
    working():  threads = own + Σ lendable threads of waiting peers ÷ working peers (this host)

A waiting role's threads go back the moment it marks itself working (its batch arrived: the
generator sees that at its next decode chunk and drops to its own threads). Records of dead
processes and of other hosts (a run directory on a shared file system) are ignored. Counters
(``cores/threads``, ``cores/borrowed_s``, ``cores/lent_s``, ``cores/switches``) go to each
role's metrics.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path

from dapo_async.utils import pid_alive

# How often a role looks for peers that started or died (listing the directory every decode
# chunk would cost more than the chunk's bookkeeping).
PEER_SCAN_S = 1.0
# Weight of the newest observation in the idle ratio's moving average (about the last 3 steps).
IDLE_EMA_WEIGHT = 0.3
# A peer's threads are borrowed only once it has waited this long: a generator between two
# decode batches waits a few milliseconds, and a learner that took its core then would compute
# on it long after the generator resumed (roles re-check at every forward, not continuously).
MIN_LEND_WAIT_S = 0.05
# A record's fixed size: rewritten in place with one pwrite, so a reader never sees a file
# shorter than a whole record (a torn read fails to parse and is skipped until the next).
RECORD_BYTES = 192


class CoreShare:
    """This process's place in its host's core ledger (see the module docstring)."""

    def __init__(
        self,
        directory: str | Path,
        name: str,
        threads: int,
        lend_idle_above: float,
        set_threads: Callable[[int], None] | None = None,
    ):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.name, self.own = name, threads
        self.lend_idle_above = lend_idle_above
        self._set_threads = set_threads or _torch_set_threads
        self.host = socket.gethostname()
        self.idle_ema = 0.0
        self._observed = False
        self.is_waiting = False
        self.threads = threads
        self._peers: dict[str, int] = {}  # name -> open fd of its record
        self._scanned = 0.0
        self._since = time.monotonic()  # when the current state (and thread count) began
        self._waiting_since = 0.0
        self.counters = {"borrowed_s": 0.0, "lent_s": 0.0, "switches": 0}
        self._fd = os.open(self.dir / name, os.O_RDWR | os.O_CREAT, 0o600)
        self._write()

    # ------------------------------------------------------------------ marks

    def waiting(self) -> None:
        """This role blocks on the other side now; its threads may be lent (threads it
        borrowed stay set until its next ``working``: they compute nothing meanwhile)."""
        if not self.is_waiting:
            self._account()
            self.is_waiting = True
            self._waiting_since = time.time()  # wall clock: peers compare it with theirs
            self._write()

    def working(self) -> int:
        """This role computes now: its threads back, plus what waiting peers lend."""
        if self.is_waiting:
            self._account()
            self.is_waiting = False
            self._write()
        want = self.own + self._borrowable()
        if want != self.threads:
            self._account()
            self._set_threads(want)
            self.threads = want
            self.counters["switches"] += 1
        return want

    def watch(self, modules) -> None:
        """Call ``working()`` before every forward of each of ``modules`` (the generator's
        model: once per decode step; the learner's decoder layers: a few times per micro-batch),
        so a lender that woke up has its threads back within one of them."""
        for m in modules:
            m.register_forward_pre_hook(self._forward_hook)

    def _forward_hook(self, module, args) -> None:
        self.working()  # returns None: the forward's arguments stay as they are

    def observe_idle(self, ratio: float) -> None:
        """The share of the last step (or report period) this role spent waiting."""
        ratio = min(max(float(ratio), 0.0), 1.0)
        if not self._observed:  # the first observation is the whole average so far
            self.idle_ema, self._observed = ratio, True
        self.idle_ema += IDLE_EMA_WEIGHT * (ratio - self.idle_ema)
        self._write()

    @property
    def lends(self) -> bool:
        return self.is_waiting and self.idle_ema > self.lend_idle_above

    def metrics(self) -> dict[str, float]:
        self._account()
        return {
            "cores/threads": float(self.threads),
            "cores/idle_ema": self.idle_ema,
            "cores/borrowed_s": self.counters["borrowed_s"],
            "cores/lent_s": self.counters["lent_s"],
            "cores/switches": float(self.counters["switches"]),
        }

    def close(self) -> None:
        if self._fd >= 0:
            self._account()
            self._set_threads(self.own)
            os.close(self._fd)
            self._fd = -1
            (self.dir / self.name).unlink(missing_ok=True)
        for fd in self._peers.values():
            os.close(fd)
        self._peers = {}

    # ------------------------------------------------------------------ ledger

    def _account(self) -> None:
        now = time.monotonic()
        dt, self._since = now - self._since, now
        if self.threads > self.own and not self.is_waiting:  # computing on lent threads
            self.counters["borrowed_s"] += dt
        if self.lends:
            self.counters["lent_s"] += dt

    def _write(self) -> None:
        rec = {
            "host": self.host,
            "pid": os.getpid(),
            "threads": self.own,
            "waiting": self.is_waiting,
            "since": round(self._waiting_since, 3),
            "idle": round(self.idle_ema, 4),
        }
        data = json.dumps(rec).encode()
        assert len(data) < RECORD_BYTES, "core ledger record outgrew its size"
        os.pwrite(self._fd, data.ljust(RECORD_BYTES), 0)

    def _scan(self) -> None:
        now = time.monotonic()
        if now - self._scanned < PEER_SCAN_S:
            return
        self._scanned = now
        names = {p.name for p in self.dir.iterdir()} - {self.name}
        for gone in set(self._peers) - names:
            os.close(self._peers.pop(gone))
        for name in names - set(self._peers):
            try:
                self._peers[name] = os.open(self.dir / name, os.O_RDONLY)
            except OSError:
                continue

    def _read(self, fd: int) -> dict | None:
        try:
            rec = json.loads(os.pread(fd, RECORD_BYTES, 0).decode().strip())
        except (OSError, ValueError, UnicodeDecodeError):
            return None
        if not isinstance(rec, dict) or rec.get("host") != self.host:
            return None
        return rec

    def _borrowable(self) -> int:
        """This role's share of the threads waiting peers on this host lend."""
        self._scan()
        lent = working = 0
        now = time.time()
        for name, fd in sorted(self._peers.items()):
            rec = self._read(fd)
            if rec is None:
                continue
            if not pid_alive(int(rec.get("pid", 0))):  # a role that died: its record goes too
                (self.dir / name).unlink(missing_ok=True)
                continue
            if not rec.get("waiting"):
                working += 1
            elif (
                float(rec.get("idle", 0)) > self.lend_idle_above
                and now - float(rec.get("since", now)) >= MIN_LEND_WAIT_S
            ):
                lent += int(rec.get("threads", 0))
        return lent // (working + 1)


def _torch_set_threads(n: int) -> None:
    import torch

    torch.set_num_threads(n)


def decoder_layers(model) -> list:
    """The transformer blocks of a transformers model (``*DecoderLayer``), or the model itself
    when it names none."""
    layers = [m for m in model.modules() if type(m).__name__.endswith("DecoderLayer")]
    return layers or [model]


def for_role(cfg, name: str, engine: str = "hf") -> CoreShare | None:
    """This role's ``CoreShare`` in ``<run_dir>/cores`` when ``launch.share_cores`` is on; None
    for a vLLM generator (its forward runs in worker processes this one's threads never touch)."""
    if not cfg.launch.share_cores or engine != "hf":
        return None
    return CoreShare(
        cfg.resolved_run_dir / "cores",
        name,
        cfg.launch.torch_threads,
        cfg.launch.lend_idle_above,
    )
