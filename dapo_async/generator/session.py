"""What both generator loops share (batch: ``loop.GeneratorLoop``, stream: ``stream.StreamLoop``):
the conversation with the buffer and the way finished responses become acknowledged groups.

    hello ── until the buffer acks it (``retry:hello`` starts over) ── heartbeat every heartbeat_s
    finished responses ─► score_groups (one scorer call) ─► send_groups: outbox + ScoredGroups
    pump(): acks remove groups from the outbox; grants are kept for the loop; unacked groups
            are resent after RESEND_S; on exit, flush waits briefly for the last acks

A group leaves the outbox only when the buffer acknowledged it (stored, duplicate or rejected
with a reason), so a buffer restart loses nothing the generator produced. Subclasses supply
``step(stop)``: one turn of their loop.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Callable

import numpy as np
import zmq

from dapo_async import protocol, transport
from dapo_async.cores import CoreShare
from dapo_async.engines.base import Engine, SamplingParams
from dapo_async.generator.rollout import make_group
from dapo_async.generator.scoring import ScoreItem, Scorer
from dapo_async.rollouts import EpisodeRunner, single_turn
from dapo_async.sample_records import group_record, newest_version
from dapo_async.samples import SampleLog

log = logging.getLogger(__name__)

# Resend an unacknowledged group after this long (the buffer may have restarted).
RESEND_S = 5.0
# A lease request unanswered this long is sent again.
LEASE_TIMEOUT_S = 5.0
# On shutdown, wait this long for the last acks.
FLUSH_TIMEOUT_S = 5.0
# How long a generator waits for the weights a lease asks for before generating anyway, and how
# often it polls for them meanwhile.
WEIGHTS_WAIT_S = 60.0
WEIGHTS_POLL_S = 0.01
# How long to wait for the buffer to acknowledge a hello before trying again.
HELLO_WAIT_S = 0.5
# Longest single wait for the lease grant before checking the stop flag again.
LEASE_POLL_S = 0.05


class GeneratorSession:
    """One generator's session with the buffer, over ``sock``, for groups sampled by ``engine``
    (``engines.base.Engine``) and scored by ``scorer``."""

    def __init__(
        self,
        generator_id: str,
        engine: Engine,
        scorer: Scorer,
        sock: zmq.Socket,
        params: SamplingParams,
        prompts_per_batch: int,
        heartbeat_s: float = 2.0,
        poll_weights: Callable[[], None] | None = None,
        on_metrics: Callable[[dict[str, float]], None] | None = None,
        engine_name: str = "hf",
        cores: CoreShare | None = None,
        samples: SampleLog | None = None,
        rollout: Callable | None = None,
        turn_updates: bool = False,
    ):
        self.id = generator_id
        self.engine = engine
        self.scorer = scorer
        # the reward's parts, in the order each response's components hold them
        self.component_names = list(scorer.component_names)
        self.sock = sock
        self.params = params
        self.prompts_per_batch = prompts_per_batch
        self.heartbeat_s = heartbeat_s
        self.poll_weights = poll_weights
        self.on_metrics = on_metrics
        self.engine_name = engine_name
        self.cores = cores  # this host's core ledger (``dapo_async.cores``), or None
        self.samples = samples  # readable rollouts (``dapo_async.samples``), or None
        # episodes (``dapo_async.rollouts``): the rollout function's turns on this engine; with
        # ``turn_updates`` new weights may land between the turns of an episode
        self.runner = EpisodeRunner(
            rollout or single_turn,
            engine,
            params,
            getattr(engine, "tokenizer", None),
            between_turns=poll_weights if turn_updates else None,
        )
        self.rollout_info: dict[str, float] = {}  # last batch's Trajectory.info means
        self._idle_seen = (0.0, time.monotonic())  # (time_idle, when) at the last observation
        self.seq = 0
        self.outbox: OrderedDict[protocol.GroupId, tuple[protocol.Group, float]] = OrderedDict()
        self._grant: protocol.LeaseGrant | None = None
        self.extras: dict[int, str] = {}  # lease id -> extra_info JSON
        self._hello_acked = False
        self._last_heartbeat = 0.0
        self.counters = {
            "groups_sent": 0,
            "groups_acked": 0,
            "resent": 0,
            "tokens": 0,
            "batches": 0,
        }
        self.time_generating = 0.0
        self.time_idle = 0.0
        # engine occupancy: seconds × sequence slots offered, and those doing useful work
        self.t_slots = self.t_used = 0.0
        self._t_start = time.monotonic()

    def step(self, stop) -> bool:
        """One turn of the loop; False when nothing was generated."""
        raise NotImplementedError

    # ------------------------------------------------------------------ socket

    def _send(self, msg: protocol.Message) -> None:
        try:
            transport.send(self.sock, msg, flags=zmq.NOBLOCK)
        except zmq.Again:  # queue full (buffer away): the outbox resends later
            log.debug("send queue full; %s dropped for now", msg.KIND)

    def pump(self, timeout_s: float = 0.0, until: Callable[[], bool] | None = None) -> None:
        """Handle replies that arrive within ``timeout_s`` (then whatever is queued); with
        ``until``, return as soon as it holds and the queue is empty."""
        deadline = time.monotonic() + timeout_s
        while True:
            left = max(0.0, deadline - time.monotonic())
            if until is not None and until():
                left = 0.0
            if not self.sock.poll(int(left * 1000)):
                return
            try:
                msg = transport.recv(self.sock, timeout_s=None)
            except protocol.ProtocolError as e:
                log.warning("bad message from buffer: %s", e)
                continue
            if isinstance(msg, protocol.Ack):
                self._on_ack(msg)
            elif isinstance(msg, protocol.LeaseGrant):
                self._grant = msg
                # each prompt's extra_info, for reward functions that take it (until scored)
                self.extras.update(zip(msg.prompt_ids, msg.extra_infos))
            if time.monotonic() >= deadline and not self.sock.poll(0):
                return

    def _on_ack(self, ack: protocol.Ack) -> None:
        if not ack.group_ids:
            self._hello_acked = True
            return
        rehello = False
        for gid, status in zip(ack.group_ids, ack.statuses):
            if status == "retry:hello":
                rehello = True
                continue
            if self.outbox.pop(tuple(gid), None) is not None:
                self.counters["groups_acked"] += 1
                if status.startswith("rejected"):
                    log.warning("group %s rejected by the buffer: %s", gid, status)
        if rehello:
            self._hello_acked = False
            self.hello()

    def hello(self) -> None:
        spare = self.cores is not None and self.cores.spare
        self._send(protocol.Hello(self.id, os.getpid(), self.engine_name, spare=spare))

    def heartbeat(self, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self._last_heartbeat >= self.heartbeat_s:
            self._send(protocol.Heartbeat(self.id, self.engine.version, len(self.outbox)))
            self._last_heartbeat = now

    def resend(self) -> None:
        now = time.monotonic()
        due = [g for g, t in self.outbox.values() if now - t >= RESEND_S]
        if not due:
            return
        for g in due:
            self.outbox[g.group_id] = (g, now)
        self._send(
            protocol.ScoredGroups(batch=protocol.GroupBatch.from_groups(due, self.component_names))
        )
        self.counters["resent"] += len(due)

    def keep_in_touch(self) -> bool:
        """Hello until the buffer knows us (False while it does not), heartbeat, resend what
        is overdue: what every loop iteration does before generating."""
        if not self._hello_acked:
            self.hello()
            self.pump(HELLO_WAIT_S, until=lambda: self._hello_acked)
            if not self._hello_acked:
                return False
        self.heartbeat()
        self.resend()
        return True

    # ------------------------------------------------------------------ cores

    def cores_waiting(self) -> None:
        """Blocked on the buffer or the learner: this generator's threads may be lent."""
        if self.cores is not None:
            self.cores.waiting()

    def cores_working(self) -> None:
        """About to compute: own threads back, plus what waiting roles on this host lend."""
        if self.cores is not None:
            self.cores.working()

    def take_weights(self) -> None:
        """Newer weights if the learner published some (the stream loop: mid-sequence too)."""
        if self.poll_weights is not None:
            self.poll_weights()

    def on_parked(self) -> None:
        """A spare generator waiting for a lent core (``cores.CoreShare.working``) stays a live
        member meanwhile: heartbeats to the buffer, weight rounds with the others."""
        self.heartbeat()
        self.take_weights()

    def cores_metrics(self) -> dict[str, float]:
        """The idle share since the last call goes into the ledger; its counters come back."""
        if self.cores is None:
            return {}
        now = time.monotonic()
        idle0, t0 = self._idle_seen
        if now - t0 > 0:
            self.cores.observe_idle((self.time_idle - idle0) / (now - t0))
        self._idle_seen = (self.time_idle, now)
        return self.cores.metrics()

    # ------------------------------------------------------------------ groups

    def score_groups(self, done: list[tuple], version: int) -> list[protocol.Group]:
        """Score the responses of several prompts in one reward-pool call and make one group
        each. ``done``: (lease id, prompt, ground truth, completions, generation seconds) per
        prompt; ``version`` tags tokens whose completion carries no versions of its own."""
        items, prompt_texts = [], []
        for lease_id, prompt, truth, comps, _ in done:
            prompt_texts.append(self._prompt_text(prompt))
            extra = _json_dict(self.extras.pop(lease_id, ""))
            # overlong shaping counts what the policy sampled, not environment tokens
            items += [
                ScoreItem(c.text, truth, c.num_sampled, prompt_texts[-1], extra, c.rollout_reward)
                for c in comps
            ]
        scored = self.scorer(items)
        groups, k = [], 0
        for (lease_id, prompt, _, comps, took), text in zip(done, prompt_texts):
            sc = scored[k : k + len(comps)]
            k += len(comps)
            g = make_group(self.id, self.seq, lease_id, prompt, comps, sc, version, took)
            self.seq += 1
            groups.append(g)
            if self.samples is not None and self.samples.take(newest_version(g)):
                texts = [c.text for c in comps]
                self.samples.write(group_record(g, text, texts, self.component_names))
        return groups

    def extra_info(self, lease_id: int) -> dict:
        """A leased prompt's extra_info (kept until its group is scored)."""
        return _json_dict(self.extras.get(lease_id, ""))

    def _prompt_text(self, prompt) -> str:
        """The prompt as the model saw it (reward functions may take it)."""
        tok = getattr(self.engine, "tokenizer", None)
        return tok.decode(list(map(int, prompt))) if tok is not None else ""

    def send_groups(self, groups: list[protocol.Group]) -> None:
        """Into the outbox (until acknowledged), then one ScoredGroups message."""
        now = time.monotonic()
        for g in groups:
            self.outbox[g.group_id] = (g, now)
        self._send(
            protocol.ScoredGroups(
                batch=protocol.GroupBatch.from_groups(groups, self.component_names)
            )
        )
        self.counters["groups_sent"] += len(groups)
        self.counters["batches"] += 1
        self.counters["tokens"] += sum(g.num_tokens for g in groups)

    def reward_metrics(self, groups: list[protocol.Group]) -> dict[str, float]:
        """Mean reward and accuracy of ``groups``, each part of the reward on its own, and the
        reward model's failed requests so far."""
        out = {
            "generator/reward_mean": float(np.concatenate([g.rewards for g in groups]).mean()),
            "generator/accuracy": float(np.concatenate([g.acc for g in groups]).mean()),
        }
        comps = np.concatenate([g.components for g in groups])
        for i, name in enumerate(self.component_names):
            out[f"generator/reward_{name}_mean"] = float(comps[:, i].mean())
        if self.scorer.model is not None:
            out["generator/reward_model_failures"] = float(self.scorer.model.failures)
        return out

    # ------------------------------------------------------------------ run

    def run(self, stop) -> dict:
        self.hello()
        while not stop:
            self.step(stop)
        self.flush()
        return self.counters

    def flush(self, timeout_s: float = FLUSH_TIMEOUT_S) -> None:
        """Before exit: wait briefly for the acks of what is still in the outbox."""
        self.counters["engine_occupancy"] = round(self.t_used / max(self.t_slots, 1e-9), 4)
        for key, value in self.cores_metrics().items():
            self.counters[key] = round(value, 3)
        deadline = time.monotonic() + timeout_s
        if self.outbox:
            for g, _ in list(self.outbox.values()):
                self.outbox[g.group_id] = (g, 0.0)
            self.resend()
        while self.outbox and time.monotonic() < deadline:
            self.pump(0.1)
        if self.outbox:
            log.warning("exiting with %d unacknowledged groups", len(self.outbox))


def _json_dict(text: str) -> dict:
    """A lease's extra_info (JSON object text; anything else is no extra_info)."""
    try:
        out = json.loads(text) if text else {}
    except ValueError:
        return {}
    return out if isinstance(out, dict) else {}
