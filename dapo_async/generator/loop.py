"""The batch generator loop: lease prompts → sample G responses each → score → send groups.

    ┌─► take new weights (if a new version is ready)
    │   lease prompts from the buffer ── none granted? wait (servicing acks), retry
    │   engine.generate(prompts, n=G) ── every token tagged with the engine's version
    │   score each response (reward pool: isolated workers with timeouts)
    │   outbox[group id] = group ; send ScoredGroups
    └── pump replies: acks remove from the outbox; unacked groups are resent

Hello, heartbeats, the outbox, acks and resends are the session's (``session.GeneratorSession``,
shared with the stream loop).
"""

from __future__ import annotations

import logging
import time

import numpy as np

from dapo_async import protocol
from dapo_async.generator.session import (
    LEASE_POLL_S,
    LEASE_TIMEOUT_S,
    WEIGHTS_POLL_S,
    WEIGHTS_WAIT_S,
    GeneratorSession,
)
from dapo_async.rollouts import Sample, info_means

log = logging.getLogger(__name__)

# Longest single wait while the buffer grants nothing (keeps Ctrl-C and weights responsive).
MAX_IDLE_WAIT_S = 0.5


class GeneratorLoop(GeneratorSession):
    """Generates for one lease at a time: the rollout function's episodes on the engine's
    ``generate``."""

    def step(self, stop) -> bool:
        """One lease → generate → send round; False if nothing was generated."""
        if self.poll_weights is not None:
            self.poll_weights()
        if not self.keep_in_touch():
            return False
        t_wait = time.monotonic()
        self.cores_waiting()
        grant = self.lease(stop)
        if grant is None or not grant.prompt_ids:
            wait = min(grant.wait_s if grant else 0.1, MAX_IDLE_WAIT_S)
            self.pump(wait)
            self.time_idle += time.monotonic() - t_wait
            return False
        self._await_weights(grant.min_version, stop)
        self.time_idle += time.monotonic() - t_wait
        self.cores_working()
        groups, t_gen = self.rollout(grant)
        self.send_groups(groups)
        self.pump(0.0)
        if self.on_metrics is not None:
            self.on_metrics(self._metrics(groups, t_gen))
        return True

    def lease(self, stop) -> protocol.LeaseGrant | None:
        """Ask for prompts; returns the grant (possibly empty) or None on timeout/stop."""
        self._grant = None
        self._send(protocol.LeaseRequest(self.id, self.prompts_per_batch, self.engine.version))
        deadline = time.monotonic() + LEASE_TIMEOUT_S
        while self._grant is None and time.monotonic() < deadline and not stop:
            self.pump(LEASE_POLL_S, until=lambda: self._grant is not None)
        return self._grant

    def rollout(self, grant: protocol.LeaseGrant) -> tuple[list[protocol.Group], float]:
        """Play G episodes of every leased prompt with the rollout function (``generator.
        rollout``; the default samples one response each in one engine call) and score them:
        (groups, seconds spent in the episodes). Every token carries the version of the
        weights that sampled it."""
        t0 = time.monotonic()
        version = self.engine.version
        g = self.params.n
        samples = [
            Sample(list(map(int, prompt)), truth, extra=self.extra_info(lease_id), index=i)
            for lease_id, prompt, truth in zip(grant.prompt_ids, grant.prompts, grant.ground_truths)
            for i in range(g)
        ]
        completions = [t.completion() for t in self.runner.run(samples)]
        outs = [completions[k : k + g] for k in range(0, len(completions), g)]
        t_gen = time.monotonic() - t0
        lens = [c.num_sampled for c in completions]
        if lens:  # a batch decodes max(lens) steps for every row; the rest is padding
            self.t_slots += t_gen
            self.t_used += t_gen * sum(lens) / (len(lens) * max(max(lens), 1))
        per_prompt = t_gen / max(len(outs), 1)
        self.rollout_info = info_means(completions)
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
        out.update({f"generator/rollout/{k}": v for k, v in self.rollout_info.items()})
        out.update(self.cores_metrics())
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
