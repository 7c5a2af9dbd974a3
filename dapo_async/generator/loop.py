"""The generator loop: lease prompts → sample G responses each → score → send groups → acks.

    ┌─► take new weights (if a new version is ready)
    │   lease prompts from the buffer ── none granted? wait (servicing acks), retry
    │   engine.generate(prompts, n=G) ── every token tagged with the engine's version
    │   score each response (reward pool: isolated workers with timeouts)
    │   outbox[group id] = group ; send ScoredGroups
    └── pump replies: acks remove from the outbox; unacked groups are resent after RESEND_S

A group leaves the outbox only when the buffer acknowledged it (stored, duplicate or rejected
with a reason), so a buffer restart loses nothing the generator produced. ``retry:hello`` (the
buffer does not know us) re-sends Hello and keeps the group.
"""

from __future__ import annotations

import json
import logging
import time
from collections import OrderedDict
from collections.abc import Callable

import numpy as np
import zmq

from dapo_async import protocol, transport
from dapo_async.engines.base import SamplingParams
from dapo_async.generator.rollout import make_group
from dapo_async.reward.compose import COMPONENT_NAMES

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
# Longest single wait while the buffer grants nothing (keeps Ctrl-C and weights responsive).
MAX_IDLE_WAIT_S = 0.5


class GeneratorLoop:
    def __init__(
        self,
        generator_id: str,
        engine,
        score_fn: Callable[[list[tuple]], list],  # (response, truth, tokens, prompt, extra)
        sock: zmq.Socket,
        params: SamplingParams,
        prompts_per_batch: int,
        heartbeat_s: float = 2.0,
        poll_weights: Callable[[], None] | None = None,
        on_metrics: Callable[[dict[str, float]], None] | None = None,
        engine_name: str = "hf",
    ):
        self.id = generator_id
        self.engine = engine
        self.score_fn = score_fn
        # the reward's parts, in the order each response's components hold them
        self.component_names = list(getattr(score_fn, "component_names", COMPONENT_NAMES))
        self.sock = sock
        self.params = params
        self.prompts_per_batch = prompts_per_batch
        self.heartbeat_s = heartbeat_s
        self.poll_weights = poll_weights
        self.on_metrics = on_metrics
        self.engine_name = engine_name
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
        import os

        self._send(protocol.Hello(self.id, os.getpid(), self.engine_name))

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

    def lease(self, stop) -> protocol.LeaseGrant | None:
        """Ask for prompts; returns the grant (possibly empty) or None on timeout/stop."""
        self._grant = None
        self._send(protocol.LeaseRequest(self.id, self.prompts_per_batch, self.engine.version))
        deadline = time.monotonic() + LEASE_TIMEOUT_S
        while self._grant is None and time.monotonic() < deadline and not stop:
            self.pump(LEASE_POLL_S, until=lambda: self._grant is not None)
        return self._grant

    # ------------------------------------------------------------------ main loop

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

    def step(self, stop) -> bool:
        """One lease → generate → send round; False if nothing was generated."""
        if self.poll_weights is not None:
            self.poll_weights()
        if not self.keep_in_touch():
            return False
        t_wait = time.monotonic()
        grant = self.lease(stop)
        if grant is None or not grant.prompt_ids:
            wait = min(grant.wait_s if grant else 0.1, MAX_IDLE_WAIT_S)
            self.pump(wait)
            self.time_idle += time.monotonic() - t_wait
            return False
        self._await_weights(grant.min_version, stop)
        self.time_idle += time.monotonic() - t_wait
        groups, t_gen = self.rollout(grant)
        self.send_groups(groups)
        self.pump(0.0)
        if self.on_metrics is not None:
            self.on_metrics(self._metrics(groups, t_gen))
        return True

    def rollout(self, grant: protocol.LeaseGrant) -> tuple[list[protocol.Group], float]:
        """Sample G responses for every leased prompt and score them: (groups, seconds spent
        in the engine). Every token carries the engine's version at the start of the call."""
        t0 = time.monotonic()
        version = self.engine.version
        outs = self.engine.generate(grant.prompts, self.params)
        t_gen = time.monotonic() - t0
        lens = [len(c.tokens) for comps in outs for c in comps]
        if lens:  # a batch decodes max(lens) steps for every row; the rest is padding
            self.t_slots += t_gen
            self.t_used += t_gen * sum(lens) / (len(lens) * max(max(lens), 1))
        per_prompt = t_gen / max(len(outs), 1)
        groups = self.score_groups(
            [
                (lease_id, prompt, truth, comps, per_prompt)
                for lease_id, prompt, truth, comps in zip(
                    grant.prompt_ids, grant.prompts, grant.ground_truths, outs
                )
            ],
            version,
        )
        self.time_generating += time.monotonic() - t0
        return groups, t_gen

    def score_groups(self, done: list[tuple], version: int) -> list[protocol.Group]:
        """Score the responses of several prompts in one reward-pool call and make one group
        each. ``done``: (lease id, prompt, ground truth, completions, generation seconds) per
        prompt; ``version`` tags tokens whose completion carries no versions of its own."""
        items = []
        for lease_id, prompt, truth, comps, _ in done:
            prompt_text = self._prompt_text(prompt)
            extra = _json_dict(self.extras.pop(lease_id, ""))
            items += [(c.text, truth, len(c.tokens), prompt_text, extra) for c in comps]
        scored = self.score_fn(items)
        groups, k = [], 0
        for lease_id, prompt, _, comps, took in done:
            sc = scored[k : k + len(comps)]
            k += len(comps)
            groups.append(make_group(self.id, self.seq, lease_id, prompt, comps, sc, version, took))
            self.seq += 1
        return groups

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

    def _metrics(self, groups: list[protocol.Group], t_gen: float) -> dict[str, float]:
        lens = np.concatenate([g.response_lens for g in groups])
        elapsed = time.monotonic() - self._t_start
        out = {
            "generator/tokens_per_s": sum(g.num_tokens for g in groups) / max(t_gen, 1e-9),
            "generator/response_len_mean": float(lens.mean()),
            "generator/idle_ratio": self.time_idle / max(elapsed, 1e-9),
            "generator/idle_s": self.time_idle,
            "generator/outbox": float(len(self.outbox)),
            "generator/version": float(self.engine.version),
            "generator/groups_sent": float(self.counters["groups_sent"]),
        }
        out.update(self.reward_metrics(groups))
        return out

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
        model = getattr(self.score_fn, "model", None)
        if model is not None:
            out["generator/reward_model_failures"] = float(model.failures)
        return out

    def _await_weights(self, min_version: int, stop) -> None:
        """Before generating for a lease, wait (bounded) for weights the staleness bound allows:
        tokens from older weights would only be dropped as stale by the buffer."""
        if self.poll_weights is None or self.engine.version >= min_version:
            return
        deadline = time.monotonic() + WEIGHTS_WAIT_S
        while self.engine.version < min_version and time.monotonic() < deadline and not stop:
            self.poll_weights()
            self.heartbeat()
            self.pump(WEIGHTS_POLL_S)
        if self.engine.version < min_version:
            log.warning(
                "generating with weights v%d although the buffer asks for v%d or newer",
                self.engine.version,
                min_version,
            )

    def run(self, stop) -> dict:
        self.hello()
        while not stop:
            self.step(stop)
        self.flush()
        return self.counters

    def flush(self, timeout_s: float = FLUSH_TIMEOUT_S) -> None:
        """Before exit: wait briefly for the acks of what is still in the outbox."""
        self.counters["engine_occupancy"] = round(self.t_used / max(self.t_slots, 1e-9), 4)
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
