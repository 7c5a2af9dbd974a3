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

Threads do not help a model too small to split across cores; a *spare* generator
(``launch.spare_generators``) does: an extra generator process at the operating system's idle
priority (``lower_priority``: it runs only on a core no other process wants) whose
``CoreShare`` owns no threads and whose ``working()`` (before each decode chunk or batch) parks
it while no role on the host has a recent idle ratio above ``launch.spare_idle_above``:

    learner idle ratio (its records) > spare_idle_above ──► spare decodes (idle priority: the
        kernel hands the learner its core back the instant its batch arrives)
    learner idle ratio < spare_idle_above × SPARE_GO_ON_FRACTION (batches queue up) ──► spare
        parks at its next chunk; heartbeats and weight rounds go on (``keepalive``)

Its counters: ``cores/spare_run_s`` (seconds it was let decode), ``cores/spare_parked_s``,
``cores/spare_parks`` (times it handed the core back), ``cores/cpu_s`` (its process's CPU time).
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
# A running spare goes on while its lender's recent idle ratio stays above this fraction of
# launch.spare_idle_above: it brings that idle down itself (from 0.35 to 0.11 on the long-tail
# workload), and one threshold would park it for succeeding, then start it again, each step.
SPARE_GO_ON_FRACTION = 0.25
# A parked spare re-reads the ledger (one pread per role on the host) and runs its
# ``keepalive`` (heartbeats, weight rounds) this often: the ratio it reads moves once per
# learner step (seconds), and a weight round waits on it no longer than this.
SPARE_POLL_S = 0.05
# Longest single park: a spare then decodes one step anyway (on nobody's core, at idle
# priority) and its loop goes round (acks, resends, reports); ``keepalive`` runs meanwhile.
SPARE_MAX_PARK_S = 5.0


class CoreShare:
    """This process's place in its host's core ledger (see the module docstring)."""

    def __init__(
        self,
        directory: str | Path,
        name: str,
        threads: int,
        lend_idle_above: float,
        set_threads: Callable[[int], None] | None = None,
        spare: bool = False,
        stop: Callable[[], bool] | None = None,
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
        self._spare_since = self._since
        self._waiting_since = 0.0
        self.counters = {"borrowed_s": 0.0, "lent_s": 0.0, "switches": 0}
        # a spare generator (see the module docstring): lends nothing, runs only on lent cores
        self.spare, self._stop = spare, stop or (lambda: False)
        self.keepalive: Callable[[], None] | None = None  # called while parked (heartbeats)
        self._parked = False
        self._lent = False  # a spare's last look at the ledger found a lender
        self.spare_counters = {"spare_run_s": 0.0, "spare_parked_s": 0.0, "spare_parks": 0}
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
        """This role computes now: its threads back, plus what waiting peers lend (a spare:
        returns once a peer lends, or after SPARE_MAX_PARK_S)."""
        if self.spare:
            self._run_when_lent()
            return self.threads
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
        } | self._spare_metrics()

    def close(self) -> None:
        if self._fd >= 0:
            self._account()
            if self.threads != self.own:
                self._set_threads(self.own)
            os.close(self._fd)
            self._fd = -1
            (self.dir / self.name).unlink(missing_ok=True)
        for fd in self._peers.values():
            os.close(fd)
        self._peers = {}

    # ------------------------------------------------------------------ spare

    def _run_when_lent(self) -> None:
        now = time.monotonic()
        if self.is_waiting:
            self.is_waiting = False
            self._write()
        if self.lent_threads() > 0:
            self._spare_account(now, parked=False)
            return
        self._spare_account(now, parked=True)
        self.spare_counters["spare_parks"] += 1
        start = now
        while not self._stop() and now - start < SPARE_MAX_PARK_S:
            time.sleep(SPARE_POLL_S)
            now = time.monotonic()
            if self.keepalive is not None:
                self.keepalive()
            if self.lent_threads() > 0:
                break
        self._spare_account(time.monotonic(), parked=False)

    def _spare_account(self, now: float, parked: bool) -> None:
        """Close the current span (decoding or parked) at ``now``; the next one is ``parked``."""
        dt, self._spare_since = now - self._spare_since, now
        key = "spare_parked_s" if self._parked else "spare_run_s"
        self.spare_counters[key] += dt
        self._parked = parked

    def _spare_metrics(self) -> dict[str, float]:
        if not self.spare:
            return {}
        return {f"cores/{k}": float(v) for k, v in self.spare_counters.items()} | {
            "cores/cpu_s": time.process_time()
        }

    def lent_threads(self) -> int:
        """For a spare: the threads of the roles on this host whose recent idle ratio says they
        wait for data (above ``lend_idle_above`` to start, above a quarter of it to go on: a
        running spare lowers the idle it is measured by, which is its job; it parks once
        batches queue up). Whether one waits this instant is the kernel's business (idle
        priority), not the ledger's: a spare then also fills the learner's short gaps."""
        bound = self.lend_idle_above * (SPARE_GO_ON_FRACTION if self._lent else 1.0)
        lent = sum(
            int(rec.get("threads", 0))
            for rec in self._live_peers()
            if float(rec.get("idle", 0)) > bound
        )
        self._lent = lent > 0
        return lent

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
            "threads": 0 if self.spare else self.own,
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

    def _live_peers(self):
        """The records of live roles on this host (a dead role's record is removed)."""
        self._scan()
        for name, fd in sorted(self._peers.items()):
            rec = self._read(fd)
            if rec is None:
                continue
            if not pid_alive(int(rec.get("pid", 0))):  # a role that died: its record goes too
                (self.dir / name).unlink(missing_ok=True)
                continue
            yield rec

    def _lending(self, rec: dict, now: float) -> bool:
        return (
            bool(rec.get("waiting"))
            and float(rec.get("idle", 0)) > self.lend_idle_above
            and now - float(rec.get("since", now)) >= MIN_LEND_WAIT_S
        )

    def _borrowable(self) -> int:
        """This role's share of the threads waiting peers on this host lend."""
        lent = working = 0
        now = time.time()
        for rec in self._live_peers():
            if not rec.get("waiting"):
                working += 1
            elif self._lending(rec, now):
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


def for_role(cfg, name: str, engine: str = "hf", kind: str = "learner", stop=None):
    """This role's ``CoreShare`` in ``<run_dir>/cores``, or None: with ``launch.share_cores``
    every hf role lends and borrows threads; with ``launch.spare_generators`` the learner lends
    (``kind="learner"``), a spare generator (``kind="spare"``) runs on what it lends, and the
    other generators stay out. None for a vLLM generator (its forward runs in worker processes
    this one's threads never touch)."""
    lc = cfg.launch
    if engine != "hf" or not (lc.share_cores or kind == "spare" or lc.spare_generators):
        return None
    if not lc.share_cores and kind == "generator":
        return None
    return CoreShare(
        cfg.resolved_run_dir / "cores",
        name,
        lc.torch_threads,
        lc.lend_idle_above if lc.share_cores else lc.spare_idle_above,
        spare=kind == "spare",
        stop=stop,
    )


def lower_priority() -> str:
    """Run this process only on cores nothing else wants: every thread of it to SCHED_IDLE
    where the OS has it (any user may lower its own), else to the lowest nice level; and its
    session's autogroup to nice 19 where it leads that session (``_lower_autogroup``). Called
    once start-up is done (model loaded, buffer connected): at this priority, beside a learner
    and a generator that never wait, start-up itself got no CPU (a spare was still waiting for
    the buffer's endpoint when a 24-step run ended). Returns what it set."""
    tids = (
        [int(t) for t in os.listdir("/proc/self/task")] if os.path.isdir("/proc/self/task") else [0]
    )
    done = ""
    if hasattr(os, "SCHED_IDLE"):
        try:
            for tid in tids:  # a thread's class is its own (Linux): each one, not just ours
                os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
            done = "SCHED_IDLE"
        except OSError:
            pass
    if not done:
        for tid in tids:
            os.setpriority(os.PRIO_PROCESS, tid, 19)
        done = "nice 19"
    if _lower_autogroup():
        done += ", autogroup nice 19"
    return done


def _lower_autogroup() -> bool:
    """Linux with autogroups (``kernel.sched_autogroup_enabled``, on by default in many
    kernels) shares a core fairly between sessions' groups first and by policy only within
    one, and the launcher starts every role in a session of its own: a SCHED_IDLE spare then
    took half of a busy core from the learner (two busy processes in two sessions on one core,
    3 s: 1.55 CPU-s to the SCHED_IDLE one; 0.08 once its group's nice was 19). So the group
    goes to the lowest weight too, but only where this process leads its session (the group is
    then itself and its children): started from a shell, it would lower the whole terminal's."""
    path = Path("/proc/self/autogroup")
    if os.getsid(0) != os.getpid() or not path.exists():
        return False
    try:
        path.write_text("19")
        return True
    except OSError:
        return False
