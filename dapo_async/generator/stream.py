"""Stream mode: sequences decode continuously; a group leaves the moment its G responses finish
and a new prompt is leased to take its place. No step waits for a whole batch.

    ┌─► new weights? take them now (inflight_updates: mid-response, between decode chunks)
    │   a grant arrived? its prompts wait until the engine holds weights the buffer allows
    │   fewer than max_inflight sequences? ask for that many prompts (non-blocking)
    │   a request started under weights too old to be trained any more? restart it (below)
    │   engine.step(): every sequence in flight advances one chunk; finished requests come back
    │   each finished request: score → group (per-token versions) → outbox → ScoredGroups
    └── pump replies (acks, grants)

A group is trained only if its oldest token is at most ``max_staleness`` versions older than
the step that takes it (the buffer drops it as stale otherwise; the grant says the bound and
the learner's version). A request whose first tokens came from weights older than the learner's
version minus that bound can only be dropped, so it starts over from its prompt under the
current weights and keeps its lease (``generator/restarted``). It happens to a spare generator
(``launch.spare_generators``), which parks for many steps with requests half done, and rarely
to one the buffer waits for.

Same outbox, acks, resends and hello/heartbeat as the batch loop (``session.GeneratorSession``,
which both extend). The stream passed in is an ``episode_stream.EpisodeStream``: its requests
are the rollout function's episodes (``generator.rollout``; ``rollouts.single_turn`` by
default), whose turns run on the engine's streaming decoder (``Engine.stream``: ``HFStream``,
``VLLMStream``).
"""

from __future__ import annotations

import time
from collections import deque

import numpy as np

from dapo_async import protocol
from dapo_async.generator.session import (
    LEASE_POLL_S,
    LEASE_TIMEOUT_S,
    WEIGHTS_WAIT_S,
    GeneratorSession,
)
from dapo_async.rollouts import Sample, info_means

# Stream-mode metrics are reported at most this often (groups may finish every few ms).
METRICS_EVERY_S = 1.0
# A batch left to drain before new prompts start (``refill_at`` below the target: the CPU
# default) asks for its next lease once this share of the target or fewer are in flight, and
# starts the prompts the moment it is empty: the grant (a round trip through the buffer,
# milliseconds on a busy machine) arrives while the last rows finish instead of after them.
LEASE_AHEAD_AT = 0.25


class StreamLoop(GeneratorSession):
    def __init__(
        self,
        *args,
        stream,
        inflight_target: int,
        inflight_updates: bool,
        refill_at: int | None = None,
        **kwargs,
    ):
        super().__init__(*args, **kwargs)
        self.stream = stream
        self.target = inflight_target
        # start new prompts once this many sequences or fewer are in flight (default:
        # continuously); ask for them from ``ask_at`` on (LEASE_AHEAD_AT)
        self.refill_at = inflight_target if refill_at is None else refill_at
        self.ask_at = max(self.refill_at, int(LEASE_AHEAD_AT * inflight_target))
        self.inflight_updates = inflight_updates
        # request id -> (lease id, prompt, ground truth, time added)
        self.inflight: dict[str, tuple[int, list[int], str, float]] = {}
        # request id -> the weights version its first tokens come from: the engine's at the
        # first decode chunk after it was added (a spare may park, taking weights, in between)
        self.started: dict[str, int] = {}
        self._unstarted: list[str] = []  # added since the last chunk
        # from the last grant: the buffer's staleness bound (-1: not said) and learner version
        self.max_staleness, self.learner_version = -1, 0
        self.counters["restarted"] = 0
        self.waiting: deque[tuple[int, list[int], str, int, float]] = deque()  # + min version
        self.lease_due = 0.0  # when the next lease request may be sent
        self.lease_pending = False
        self.update_pause_s = 0.0
        self.spans: list[int] = []  # versions spanned per finished response (since last report)
        self.lens: list[int] = []
        self._last_metrics = 0.0  # the first report goes out at once
        self.recent: list[protocol.Group] = []  # groups scored since the last report
        self.episodes: list = []  # their completions (rollout functions' info)

    # ------------------------------------------------------------------ steps

    def step(self, stop) -> bool:
        self.take_weights()
        if not self.keep_in_touch():
            return False
        self._refill()
        if self.stream.num_inflight == 0:
            self.cores_waiting()
            t0 = time.monotonic()
            self.pump(LEASE_POLL_S, until=lambda: self._grant is not None)
            self.time_idle += time.monotonic() - t0
            self._report()
            return False
        live = self.stream.num_inflight
        self.cores_working()  # (a spare may park here for many steps, taking weights)
        self._mark_started()
        self._restart_late()
        t0 = time.monotonic()
        done = self.stream.step()
        dt = time.monotonic() - t0
        self.time_generating += dt
        self.t_slots += dt * self.target
        self.t_used += dt * min(live, self.target)
        if done:
            self.send_groups(self._groups(done))
        self.pump(0.0)
        self._report()
        return True

    def take_weights(self) -> None:
        if self.poll_weights is None:
            return
        if not self.inflight_updates and self.stream.num_inflight:
            return  # only between sequences
        t0, before = time.monotonic(), self.engine.version
        self.poll_weights()
        if self.engine.version != before:
            self.update_pause_s += time.monotonic() - t0

    def _refill(self) -> None:
        now = time.monotonic()
        if self._grant is not None:
            g, self._grant = self._grant, None
            self.lease_pending = False
            self.max_staleness, self.learner_version = g.max_staleness, g.version
            for item in zip(g.prompt_ids, g.prompts, g.ground_truths):
                self.waiting.append((*item, g.min_version, now))
            if not g.prompt_ids:  # nothing admissible now: ask again after the hint
                self.lease_due = now + max(g.wait_s, LEASE_POLL_S)
        # a prompt starts once the batch is down to refill_at and the engine holds weights the
        # buffer allows (bounded wait)
        admit = self.stream.num_inflight <= self.refill_at
        while (
            admit
            and self.waiting
            and (
                self.engine.version >= self.waiting[0][3]
                or now - self.waiting[0][4] > WEIGHTS_WAIT_S
            )
        ):
            lease_id, prompt, truth, _, _ = self.waiting.popleft()
            self._start(f"{self.id}:{lease_id}", lease_id, prompt, truth, now)
        n = self.params.n
        if self.stream.num_inflight + n * len(self.waiting) > self.ask_at:
            return
        # what will be in flight when these start: at most refill_at (a draining batch is
        # asked for ahead of its end, its rows gone by then)
        left = min(self.stream.num_inflight, self.refill_at)
        free = (self.target - left) // n - len(self.waiting)
        if self.lease_pending and now - self.lease_due > LEASE_TIMEOUT_S:
            self.lease_pending = False  # lost (buffer restarting): ask again
        if free > 0 and not self.lease_pending and now >= self.lease_due:
            self._send(protocol.LeaseRequest(self.id, free, self.engine.version))
            self.lease_pending = True
            self.lease_due = now

    def _start(self, rid: str, lease_id: int, prompt, truth: str, now: float) -> None:
        sample = Sample(list(map(int, prompt)), truth, extra=self.extra_info(lease_id))
        self.stream.add_request(rid, prompt, self.params, sample)  # n episodes of the prompt
        self.inflight[rid] = (lease_id, prompt, truth, now)
        self.started[rid] = self.engine.version  # until its first chunk says (``step``)
        self._unstarted.append(rid)

    def _mark_started(self) -> None:
        """Before a decode chunk: the requests added since the last one start under the
        engine's weights now (their first tokens come from this chunk's)."""
        for rid in self._unstarted:
            if rid in self.started:
                self.started[rid] = self.engine.version
        self._unstarted = []

    def _restart_late(self) -> None:
        """Start over the requests begun under weights older than the learner's version minus
        the staleness bound (module docstring): their groups could only be dropped as stale.
        A request's version is the engine's at the first decode chunk after it was added (the
        engine takes weights only between chunks), so none that could still be trained is
        restarted (but an episode that waits on its own I/O before its first turn starts
        later than that: it may be restarted early, which costs work, not correctness); and
        none restarts while the engine itself is that far behind (``inflight_updates`` off: it takes weights only once the stream is empty, which
        restarting would never let it be)."""
        if self.max_staleness < 0:
            return
        horizon = max(self.engine.version, self.learner_version) - self.max_staleness
        if self.engine.version < horizon:
            return  # a restart now would begin too old again: first newer weights
        late = [rid for rid, v in self.started.items() if v < horizon]
        now = time.monotonic()
        for rid in late:
            lease_id, prompt, truth, _ = self.inflight[rid]
            self.stream.abort(rid)
            self._start(rid, lease_id, prompt, truth, now)
        self.counters["restarted"] += len(late)

    def _groups(self, done) -> list[protocol.Group]:
        now = time.monotonic()
        finished = []
        for rid, comps in done:
            lease_id, prompt, truth, t_added = self.inflight.pop(rid)
            del self.started[rid]
            finished.append((lease_id, prompt, truth, comps, now - t_added))
            for c in comps:
                self.spans.append(len(np.unique(c.versions)) if len(c.tokens) else 0)
                self.lens.append(len(c.tokens))
            self.episodes.extend(comps)
        groups = self.score_groups(finished, self.engine.version)
        self.recent.extend(groups)  # for the next metrics report
        return groups

    def _report(self, force: bool = False) -> None:
        now = time.monotonic()
        if self.on_metrics is None or (not force and now - self._last_metrics < METRICS_EVERY_S):
            return
        self._last_metrics = now
        self.on_metrics(self.stream_metrics())
        self.spans, self.lens, self.recent, self.episodes = [], [], [], []

    def stream_metrics(self) -> dict[str, float]:
        elapsed = time.monotonic() - self._t_start
        out = {
            "generator/inflight": float(self.stream.num_inflight),
            "generator/engine_occupancy": self.t_used / max(self.t_slots, 1e-9),
            "generator/update_pause_s": self.update_pause_s,
            "generator/idle_ratio": self.time_idle / max(elapsed, 1e-9),
            "generator/idle_s": self.time_idle,
            "generator/outbox": float(len(self.outbox)),
            "generator/version": float(self.engine.version),
            "generator/groups_sent": float(self.counters["groups_sent"]),
            "generator/restarted": float(self.counters["restarted"]),
        }
        if self.spans:
            out["generator/versions_per_response"] = float(np.mean(self.spans))
            out["generator/response_len_mean"] = float(np.mean(self.lens))
        if self.recent:
            out.update(self.reward_metrics(self.recent))
        info = info_means(self.episodes)  # Trajectory.info of a rollout function
        out.update({f"generator/rollout/{k}": v for k, v in info.items()})
        out.update(self.cores_metrics())
        return out

    def flush(self, *args, **kwargs) -> None:
        self._report(force=True)  # the last figures, whatever the period
        self.counters["update_pause_s"] = round(self.update_pause_s, 3)
        super().flush(*args, **kwargs)
        close = getattr(self.stream, "close", None)  # the episodes still in flight end here
        if close is not None:
            close()
