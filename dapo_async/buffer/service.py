"""The buffer process: a ZeroMQ ROUTER serving generators and learner ranks from one loop.

    generator ── hello / heartbeat / lease_request / scored_groups ──► ROUTER ──► BufferState
    learner   ── batch_request / checkpoint_notice ───────────────────►   │
              ◄── ack / lease_grant / batch ─────────────────────────────┘

Each loop iteration: poll (POLL_MS) → handle every queued message (bad ones are counted by
reason and dropped; a batch request for a step not ready yet is held, ``held.py``) → retry the
held batch requests → flush the write-ahead log → send the replies (so an ack never precedes
the durable record) → every STATS_EVERY_S: expire silent generators' leases, publish stats.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path

import zmq

from dapo_async import protocol, transport
from dapo_async.buffer import wal
from dapo_async.buffer.checks import GroupLimits, forbidden, semantic_error
from dapo_async.buffer.held import HeldBatchRequests
from dapo_async.buffer.identity import Identities
from dapo_async.buffer.state import BufferState
from dapo_async.config import BufferConfig
from dapo_async.data.tasks import PromptRecord

log = logging.getLogger(__name__)

POLL_MS = 50
STATS_EVERY_S = 2.0
# Ask an unlucky requester (no lease; a batch not ready, from ``handle``) to come back after this long.
RETRY_WAIT_S = 0.05
# Handle at most this many messages before flushing and replying (bounded reply latency).
MAX_MESSAGES_PER_ITERATION = 256
# File name of the write-ahead log inside the run directory (with buffer.wal on).
WAL_NAME = "buffer.wal"


class BufferService:
    def __init__(
        self,
        buffer_cfg: BufferConfig,
        shuffle_seed: int,
        limits: GroupLimits,
        records: list[PromptRecord],
        prompt_tokens: list[list[int]],
        server: transport.Server,
        wal_path: str | Path | None = None,
        on_stats: Callable[[dict[str, float]], None] | None = None,
        mixture: tuple[list[int], list[float]] | None = None,
        on_drop: Callable[[protocol.Group, str], None] | None = None,
    ):
        """``buffer_cfg``: the ``buffer`` section; ``shuffle_seed``: ``data.shuffle_seed`` (the
        prompt order); ``limits``: what a group may hold (vocabulary, response length)."""
        self.records = records
        self.prompt_tokens = prompt_tokens
        self.server = server
        self.state = BufferState(buffer_cfg, len(records), shuffle_seed, [], mixture=mixture)
        self.limits = limits
        self.on_stats = on_stats
        self.malformed: dict[str, int] = {}
        self.identities = Identities()  # generator id -> the connection that speaks for it
        # generator id -> (weights version, outbox size) from its latest heartbeat
        self.generator_views: dict[str, tuple[int, int]] = {}
        self.wal: wal.WriteAheadLog | None = None
        if wal_path is not None:
            self._recover(Path(wal_path))
            self.wal = wal.WriteAheadLog(wal_path)
        # groups filtered, gone stale or rejected from now on (not those of the replay above)
        self.on_drop = on_drop or (lambda group, reason: None)
        self.state.on_drop = self.on_drop
        self._last_stats = time.monotonic()
        self.held = HeldBatchRequests(self._serve_batch)

    # ------------------------------------------------------------------ durability

    def _recover(self, path: Path) -> None:
        records = wal.read_records(path)
        if not records:
            return
        groups, snap = [], None
        events = 0
        for kind, payload in records:
            if kind == wal.SNAPSHOT:
                snap = json.loads(payload)
            elif kind == wal.GROUP:
                groups.append(wal.decode_group(payload)[0])
            else:
                if snap is not None or groups:
                    self.state.restore(snap, groups)
                    snap, groups = None, []
                self._replay(*wal.split_event(payload))
                events += 1
        if snap is not None:
            self.state.restore(snap, groups)
        log.info(
            "recovered buffer state from %s: %d events, version %d, %d stored groups",
            path,
            events,
            self.state.version,
            len(self.state.groups),
        )

    def _replay(self, name: str, args, blob: bytes) -> None:
        s = self.state
        if name == "hello":
            s.hello(args)
        elif name == "lease":  # the count granted
            s.grant(args[0], args[1], weights_version=args[2], replay=True)
        elif name == "grant":  # logs written before "lease": the count asked for
            s.grant(args[0], args[1], weights_version=args[2] if len(args) > 2 else 0)
        elif name == "expire":
            s.expire_ids(args)
        elif name == "refuse":
            s.refuse(*args)
        elif name == "ingest":
            group, names = wal.decode_group(blob)
            if not s.component_names and s.counters.accepted == 0:
                s.component_names = list(names)
            self._ingest(group)
        elif name == "batch":
            try:
                s.batch(*args)
            except ValueError:
                pass  # it was answered with an error the first time too
        elif name == "checkpoint":
            s.mark_checkpoint(args)

    def _log(self, name: str, args, blob: bytes = b"") -> None:
        if self.wal is not None:
            self.wal.event(name, args, blob)

    # ------------------------------------------------------------------ handlers

    def handle(self, msg: protocol.Message) -> protocol.Message | None:
        """The reply to one validated message (None: no reply)."""
        handler = {
            protocol.Hello: self._on_hello,
            protocol.Heartbeat: self._on_heartbeat,
            protocol.LeaseRequest: self._on_lease_request,
            protocol.ScoredGroups: self._on_scored_groups,
            protocol.BatchRequest: self._on_batch_request,
            protocol.CheckpointNotice: self._on_checkpoint,
        }.get(type(msg))
        return handler(msg) if handler is not None else None

    def _on_hello(self, msg: protocol.Hello) -> protocol.Message:
        self.state.hello(msg.generator_id, spare=msg.spare)
        self._log("hello", msg.generator_id)
        return protocol.Ack([], [])

    def _on_heartbeat(self, msg: protocol.Heartbeat) -> None:
        self.state.heartbeat(msg.generator_id)
        self.generator_views[msg.generator_id] = (msg.version, msg.outbox_size)

    def _on_lease_request(self, msg: protocol.LeaseRequest) -> protocol.Message:
        s = self.state
        if msg.generator_id not in s.generators:
            return protocol.LeaseGrant([], [], [], [], s.version, wait_s=RETRY_WAIT_S)
        leases = s.grant(msg.generator_id, msg.num_prompts, weights_version=msg.version)
        if leases:
            self._log("lease", [msg.generator_id, len(leases), msg.version])
        recs = [self.records[ls.prompt_index] for ls in leases]
        return protocol.LeaseGrant(
            prompt_ids=[ls.lease_id for ls in leases],
            prompts=[self.prompt_tokens[ls.prompt_index] for ls in leases],
            ground_truths=[r.ground_truth for r in recs],
            data_sources=[r.data_source for r in recs],
            version=s.version,
            wait_s=0.0 if leases else RETRY_WAIT_S,
            min_version=s.oldest_allowed_version(),
            max_staleness=s.cfg.max_staleness,
            extra_infos=[json.dumps(r.extra, default=str) for r in recs],
        )

    def _on_scored_groups(self, msg: protocol.ScoredGroups) -> protocol.Message:
        s, names = self.state, msg.batch.component_names
        if names != s.component_names:
            if s.counters.accepted == 0 and not s.groups:
                s.component_names = list(names)  # the first generator sets the schema
            else:
                n = len(msg.batch)
                self.malformed["component_names"] = self.malformed.get("component_names", 0) + n
                return protocol.Ack(msg.batch.group_ids(), ["rejected:component_names"] * n)
        statuses = []
        for i in range(len(msg.batch)):
            g = msg.batch.group(i)
            status = self._ingest(g)
            if status == "stored":
                self._log("ingest", None, wal.encode_group(g, msg.batch.component_names))
            elif status.startswith("rejected:"):  # its effect, not its (maybe huge) arrays
                self._log("refuse", [g.prompt_id, g.generator_id, status.split(":", 1)[1]])
            statuses.append(status)
        return protocol.Ack(msg.batch.group_ids(), statuses)

    def _ingest(self, group: protocol.Group) -> str:
        """Semantic checks (``buffer/checks.py``), then the state machine's ingest."""
        lease = self.state.leases.get(group.prompt_id)
        leased = None if lease is None else self.prompt_tokens[lease.prompt_index]
        reason = semantic_error(group, self.limits, leased)
        if reason:
            log.warning("group %s rejected: %s", group.group_id, reason)
            status = self.state.reject(group, reason)
            if status.startswith("rejected:"):
                self.on_drop(group, status)
            return status
        return self.state.ingest(group)

    def _on_batch_request(self, msg: protocol.BatchRequest) -> protocol.Message:
        return self._with_stats(self._serve_batch(msg)[0])

    def _with_stats(self, reply: protocol.Batch) -> protocol.Batch:
        """A "not ready" reply about to leave gets the counters (a starving learner says why
        it waits from them); built only then, not at each retry of a held request."""
        if not reply.ready and not reply.stats:
            reply.stats = self.stats()
        return reply

    def _serve_batch(self, msg: protocol.BatchRequest) -> tuple[protocol.Batch, bool]:
        """The reply, and whether it is final (False: the step is not ready yet)."""
        try:
            res = self.state.batch(msg.step, msg.rank, msg.world_size)
        except ValueError as e:
            log.warning("bad batch request %s: %s", msg, e)
            self.malformed["bad_batch_request"] = self.malformed.get("bad_batch_request", 0) + 1
            return protocol.Batch(msg.step, msg.rank, False, wait_s=1.0), True
        self._log("batch", [msg.step, msg.rank, msg.world_size])
        if res is None:  # (the counters are added if this reply leaves: ``_with_stats``)
            return protocol.Batch(msg.step, msg.rank, False, wait_s=RETRY_WAIT_S), False
        batch, tokens, num_groups = res
        reply = protocol.Batch(
            msg.step, msg.rank, True, tokens, num_groups, 0.0, self.stats(), batch
        )
        return reply, True

    def _on_checkpoint(self, msg: protocol.CheckpointNotice) -> protocol.Message | None:
        try:
            self.state.mark_checkpoint(msg.step)
        except ValueError as e:
            log.warning("bad checkpoint notice: %s", e)
            self.malformed["bad_checkpoint"] = self.malformed.get("bad_checkpoint", 0) + 1
            return None
        self._log("checkpoint", msg.step)
        self.compact()
        return protocol.Ack([], [])

    def maybe_compact(self) -> None:
        """Compact a log that grew too large without a checkpoint (``wal.needs_compaction``);
        called between messages, when the state holds everything acknowledged."""
        if self.wal is not None and self.wal.needs_compaction():
            self.compact()

    def compact(self) -> None:
        if self.wal is None:
            return
        blobs = [
            wal.encode_group(g, self.state.component_names) for g in self.state.groups.values()
        ]
        self.wal.compact(self.state.snapshot(), blobs)

    # ------------------------------------------------------------------ loop

    def run_once(self) -> int:
        """Handle the messages queued now; returns how many were handled."""
        sock = self.server.socket
        replies: list[tuple[bytes, protocol.Message]] = []
        n, changed = self._receive(sock, replies) if sock.poll(POLL_MS) else (0, False)
        replies += [(ident, self._with_stats(r)) for ident, r in self.held.retry(changed)]
        if self.wal is not None and (n or replies):
            self.wal.flush()
            self.maybe_compact()
        for ident, reply in replies:
            try:
                transport.send_routed(sock, ident, reply)
            except zmq.ZMQError as e:  # peer gone: it will resend
                log.debug("reply to a departed peer dropped: %s", e)
        self._periodic()
        return n

    def _receive(self, sock, replies: list) -> tuple[int, bool]:
        """Handle up to MAX_MESSAGES_PER_ITERATION queued messages, their replies appended to
        ``replies``; returns how many, and whether one may have made a held step ready."""
        n, changed = 0, False
        authenticated = self.server.roles is not None
        while n < MAX_MESSAGES_PER_ITERATION and sock.poll(0):
            ident, user, msg = transport.recv_routed_user(
                sock, timeout_s=None, max_bytes=self.limits.max_message_bytes
            )
            n += 1
            if isinstance(msg, protocol.ProtocolError):
                self.malformed[msg.reason] = self.malformed.get(msg.reason, 0) + 1
                continue
            role = self.server.role_of(user)
            if forbidden(role, msg, authenticated):
                key = f"forbidden_{msg.KIND}"
                if key not in self.malformed:
                    log.warning(
                        "refusing %s from a %s key (not its role's message)", msg.KIND, role
                    )
                self.malformed[key] = self.malformed.get(key, 0) + 1
                continue
            if not self.identities.admits(ident, msg, time.monotonic()):
                if "impersonation" not in self.malformed:
                    log.warning("refusing %s in the name of a generator another connection "
                                "speaks for", msg.KIND)  # fmt: skip
                self.malformed["impersonation"] = self.malformed.get("impersonation", 0) + 1
                continue
            if isinstance(msg, protocol.BatchRequest):
                reply = self.held.submit(ident, msg)  # None: held until its step is ready
                reply = reply if reply is None else self._with_stats(reply)
            else:
                reply = self.handle(msg)
                changed |= isinstance(msg, (protocol.ScoredGroups, protocol.CheckpointNotice))
            if reply is not None:
                replies.append((ident, reply))
        return n, changed

    def _periodic(self) -> None:
        now = time.monotonic()
        if now - self._last_stats < STATS_EVERY_S:
            return
        self._last_stats = now
        lost = self.state.expire_leases(now)
        self.forget_silent_generators(now)
        self.identities.forget_silent(now)
        if lost:
            self._log("expire", [ls.lease_id for ls in lost])
            c = self.state.counters
            log.warning(
                "re-issuing %d leases (silent generators, overdue, or held while the learner "
                "waits; so far: %d overdue, %d by the watchdog)",
                len(lost),
                c.lease_overdue,
                c.lease_stalled,
            )
        if self.on_stats is not None:
            self.on_stats(self.stats())

    def stats(self) -> dict[str, float]:
        out = self.state.stats()
        out.update({f"buffer/malformed_{k}": float(v) for k, v in self.malformed.items()})
        out.update(self.generator_stats(time.monotonic()))
        return out

    def _live_generators(self, now: float) -> list[str]:
        """Generators with a view heard from within ``lease_timeout_s``."""
        timeout = self.state.cfg.lease_timeout_s
        seen = self.state.generators
        return [g for g in self.generator_views if now - seen.get(g, -timeout) < timeout]

    def forget_silent_generators(self, now: float) -> None:
        """Drop the views of generators silent for ``lease_timeout_s`` (with their leases, in
        ``_periodic``): a restart comes back under a new id, so the views stay as many as the
        live generators."""
        for gone in set(self.generator_views) - set(self._live_generators(now)):
            del self.generator_views[gone]

    def generator_stats(self, now: float) -> dict[str, float]:
        """The generators heard from within ``lease_timeout_s`` (as their heartbeats say): how
        many, how many versions the oldest weights among them trail the learner, and how many
        sent groups wait in their outboxes for an ack."""
        live = self._live_generators(now)
        if not live:
            return {}
        versions = [self.generator_views[g][0] for g in live]
        return {
            "buffer/generators_live": float(len(live)),
            "buffer/generator_version_lag_max": float(max(0, self.state.version - min(versions))),
            "buffer/generator_outbox": float(sum(self.generator_views[g][1] for g in live)),
        }

    def close(self) -> None:
        if self.wal is not None:
            self.wal.close()
