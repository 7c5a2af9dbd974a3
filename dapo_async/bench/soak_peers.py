"""The peers of `bench soak`: each a thread with its own authenticated ZeroMQ connection to a
real buffer process, speaking the real protocol with the run's keys.

- ``FakeGenerator``: hello, lease, answer every lease with a scored group (mixed accuracy, so
  dynamic sampling keeps some and drops some), resend what is unacknowledged, record each
  group's ack status and its ack latency (first send → ack); told to stop, it takes no new
  lease and waits (at most DRAIN_S) for the acks of what it has sent, as a real generator
  keeps its outbox until acknowledged — a group stored in the instant of the stop is then
  counted on both sides of the books;
- ``FakeLearner``: one rank of a learner world, requesting every step's shard in turn and
  recording the group ids it was given (each step's shard is "trained" when the next is asked),
  rank 0 sending checkpoint notices;
- ``HostilePeer``: with the generators' key, acts for a real generator (heartbeats, leases and
  groups under its id), hoards leases of its own, sends groups larger than the config allows
  and frames that decode to nothing.
"""

from __future__ import annotations

import random
import threading
import time

import numpy as np
import zmq

from dapo_async import protocol as P
from dapo_async import transport as T

NAMES = ["correct", "overlong"]
# An unacknowledged group is sent again after this long (the real generator waits 5 s).
RESEND_S = 2.0
# A peer's single wait for a reply, so its stop flag is seen promptly.
RECV_S = 0.2
# Prompts a fake generator asks for at once.
PROMPTS_PER_LEASE = 2
# Tokens per fake response.
RESPONSE_TOKENS = 16
# On stop, a fake generator waits at most this long for the acks of the groups it sent (the
# buffer, still running, answers within milliseconds; the bench joins peers after 10 s).
DRAIN_S = 5.0
# Rank 0 of the fake learner sends a checkpoint notice this often (steps).
CHECKPOINT_EVERY = 20


def make_group(gen_id: str, seq: int, lease_id: int, prompt, n: int, version: int, rng):
    """A scored group of ``n`` responses of RESPONSE_TOKENS tokens, rewards ±1 at random."""
    t = n * RESPONSE_TOKENS
    acc = (rng.random(n) < 0.5).astype(np.float32)
    return P.Group(
        gen_id, seq, lease_id, np.asarray(prompt, np.int32), np.full(n, RESPONSE_TOKENS, np.int32),
        rng.integers(0, 50, t, dtype=np.int32), np.full(t, -0.3, np.float32),
        np.full(t, version, np.int32), acc * 2 - 1, acc, np.zeros((n, 2), np.float32),
        np.zeros(n, np.uint8),
    )  # fmt: skip


class _Peer(threading.Thread):
    def __init__(self, ctx, endpoint: str, keys_dir, role: str, identity: str, stop):
        super().__init__(name=identity, daemon=True)
        self.sock = T.connect_client(
            ctx, zmq.DEALER, endpoint, keys_dir=keys_dir, identity=identity.encode(), role=role
        )
        self.stop = stop
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.loop()
        except BaseException as e:  # reported by the bench
            self.error = e
        finally:
            self.sock.close(linger=0)

    def send(self, msg) -> None:
        try:
            T.send(self.sock, msg, flags=zmq.NOBLOCK)
        except zmq.Again:  # the buffer is away: resent later
            pass

    def loop(self) -> None:
        raise NotImplementedError


class FakeGenerator(_Peer):
    def __init__(self, ctx, endpoint, keys_dir, gen_id: str, responses: int, stop, seed: int):
        super().__init__(ctx, endpoint, keys_dir, "generator", gen_id, stop)
        self.id = gen_id
        self.responses = responses
        self.rng = np.random.default_rng(seed)
        self.outbox: dict[tuple[str, int], tuple[P.Group, float, float]] = {}
        self.statuses: dict[str, int] = {}
        self.stored: list[str] = []
        self.latencies: list[float] = []
        self.seq = 0
        self.version = 0

    def loop(self) -> None:
        self.send(P.Hello(self.id, 0, "soak"))
        lease_sent = 0.0
        while not self.stop.is_set():
            now = time.monotonic()
            if now - lease_sent > 2 * RECV_S:  # one lease request in flight (re-ask if lost)
                # the weights "held": the newest version the buffer announced (as a real
                # generator that takes every update)
                self.send(P.LeaseRequest(self.id, PROMPTS_PER_LEASE, self.version))
                self.send(P.Heartbeat(self.id, self.version, len(self.outbox)))
                lease_sent = now
            self._resend(now)
            if not self.sock.poll(int(RECV_S * 1000)):
                continue
            msg = T.recv(self.sock, timeout_s=0)
            if isinstance(msg, P.Ack):
                self._on_ack(msg)
            elif isinstance(msg, P.LeaseGrant):
                self._answer(msg)
                lease_sent = 0.0 if msg.prompt_ids else time.monotonic() + msg.wait_s
        self._drain()

    def _drain(self) -> None:
        """Receive the acks of the groups in flight when the stop came (no new lease)."""
        deadline = time.monotonic() + DRAIN_S
        while self.outbox and time.monotonic() < deadline:
            self._resend(time.monotonic())
            if self.sock.poll(int(RECV_S * 1000)):
                msg = T.recv(self.sock, timeout_s=0)
                if isinstance(msg, P.Ack):
                    self._on_ack(msg)

    def _answer(self, grant: P.LeaseGrant) -> None:
        self.version = max(self.version, grant.version)
        groups = []
        now = time.monotonic()
        for lease_id, prompt in zip(grant.prompt_ids, grant.prompts):
            g = make_group(self.id, self.seq, lease_id, prompt, self.responses, grant.version,
                           self.rng)  # fmt: skip
            self.outbox[g.group_id] = (g, now, now)
            self.seq += 1
            groups.append(g)
        if groups:
            self.send(P.ScoredGroups(P.GroupBatch.from_groups(groups, NAMES)))

    def _resend(self, now: float) -> None:
        due = [(g, first) for g, first, last in self.outbox.values() if now - last > RESEND_S]
        if not due:
            return
        for g, first in due:
            self.outbox[g.group_id] = (g, first, now)
        self.send(P.ScoredGroups(P.GroupBatch.from_groups([g for g, _ in due], NAMES)))

    def _on_ack(self, ack: P.Ack) -> None:
        now = time.monotonic()
        for gid, status in zip(ack.group_ids, ack.statuses):
            if status == "retry:hello":
                self.send(P.Hello(self.id, 0, "soak"))
                continue
            held = self.outbox.pop(tuple(gid), None)
            if held is None:
                continue
            self.statuses[status] = self.statuses.get(status, 0) + 1
            self.latencies.append(now - held[1])
            if status == "stored":
                self.stored.append(f"{gid[0]}:{gid[1]}")


class FakeLearner(_Peer):
    """``progress`` (shared by the ranks: rank → steps received) lets rank 0 send a checkpoint
    notice every CHECKPOINT_EVERY steps for the last step every rank has, as a real learner
    does: the buffer frees those groups and compacts its log."""

    def __init__(self, ctx, endpoint, keys_dir, rank: int, world: int, stop, progress: dict):
        super().__init__(ctx, endpoint, keys_dir, "learner", f"learner-{rank}", stop)
        self.rank, self.world, self.progress = rank, world, progress
        self.trained: dict[int, list[str]] = {}

    def loop(self) -> None:
        step = 0
        while not self.stop.is_set():
            self.send(P.BatchRequest(self.rank, self.world, step))
            if not self.sock.poll(int(RECV_S * 1000)):
                continue
            msg = T.recv(self.sock, timeout_s=0)
            if isinstance(msg, P.Batch) and msg.step == step and msg.ready:
                self.trained[step] = [f"{g}:{s}" for g, s in msg.batch.group_ids()]
                step += 1
                self.progress[self.rank] = step
                if self.rank == 0 and step % CHECKPOINT_EVERY == 0:
                    done = min(self.progress.get(r, 0) for r in range(self.world)) - 1
                    if done >= 0:
                        self.send(P.CheckpointNotice(done, f"soak-{done}"))
            elif isinstance(msg, P.Batch):
                self.stop.wait(min(msg.wait_s, RECV_S))


class HostilePeer(_Peer):
    """Every ROUND_S: one forged group and a lease request under ``victim``'s id, a lease
    request and a heartbeat of its own (hoarding), a group 16× too large on a lease it holds,
    and a frame that decodes to nothing."""

    ROUND_S = 0.1

    def __init__(self, ctx, endpoint, keys_dir, peer_id: str, victim: str, responses, stop):
        super().__init__(ctx, endpoint, keys_dir, "generator", peer_id, stop)
        self.id, self.victim, self.responses = peer_id, victim, responses
        self.rng = np.random.default_rng(abs(hash(peer_id)) % 2**32)
        self.sent = 0
        self.leases: list[tuple[int, list[int]]] = []

    def loop(self) -> None:
        self.send(P.Hello(self.id, 0, "soak"))
        seq = 0
        while not self.stop.wait(self.ROUND_S):
            forged = make_group(self.victim, 1_000_000 + seq, seq, [1, 2, 3], self.responses, 0,
                                self.rng)  # fmt: skip
            seq += 1
            self.send(P.ScoredGroups(P.GroupBatch.from_groups([forged], NAMES)))
            self.send(P.LeaseRequest(self.victim, 4))
            self.send(P.LeaseRequest(self.id, 4))
            self.send(P.Heartbeat(self.id, 0, 0))
            if self.leases:
                lease_id, prompt = self.leases.pop()
                huge = make_group(self.id, seq, lease_id, prompt, 16 * self.responses, 0, self.rng)
                self.send(P.ScoredGroups(P.GroupBatch.from_groups([huge], NAMES)))
            self.sock.send_multipart([random.randbytes(64), b"\xff" * 16], flags=zmq.NOBLOCK)
            self.sent += 6
            while self.sock.poll(0):
                msg = T.recv(self.sock, timeout_s=0)
                if isinstance(msg, P.LeaseGrant):
                    self.leases += list(zip(msg.prompt_ids, msg.prompts))
