"""Batch requests the buffer holds until their step can be served (long polling).

A learner rank that asks for a step before it can be assembled is not told to ask again later
(a learner that sleeps between asks starts its step up to a whole sleep after its data is
there: ~25 ms a step on average at 50 ms, a few percent of a CPU step and more of a GPU one);
its request is kept and answered in the loop iteration that makes the step ready:

    BatchRequest ──► serve: ready ──────────────────────────────────────────► Batch
                          └ not ready ──► held ──► retry when a group or checkpoint notice
                                                   came in, or RETRY_HELD_S passed (pacing
                                                   and lease expiry go by the clock)
                                                     ├ ready ─────────────────► Batch
                                                     └ held HOLD_S ──► Batch(ready=False,
                                                                       wait_s=0): ask again

Every try goes through the service's ``serve`` (which writes the write-ahead log's "batch"
event before any reply leaves), so a replay assembles the same steps as the live run.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from dapo_async import protocol

# Answer a held request "not ready" after this long: the rank then asks again at once. Well
# under the learner's BATCH_REQUEST_TIMEOUT_S (10 s), so a held request never looks like a
# buffer that stopped answering, and the counters a starving learner logs stay fresh.
HOLD_S = 1.0
# Try the held requests at least this often when no message changed the buffer: a step held
# for an outstanding lease (pacing) is released by the clock (a silent generator, an expiry).
RETRY_HELD_S = 0.05

Serve = Callable[[protocol.BatchRequest], tuple[protocol.Batch, bool]]
Key = tuple[bytes, int, int]  # (connection, rank, step)


class HeldBatchRequests:
    def __init__(self, serve: Serve, clock: Callable[[], float] = time.monotonic):
        """``serve(request)`` → (reply, final): final is False when the step is not ready."""
        self._serve = serve
        self._clock = clock
        self._held: dict[Key, tuple[protocol.BatchRequest, float, float]] = {}  # since, tried

    def __len__(self) -> int:
        return len(self._held)

    def submit(self, ident: bytes, msg: protocol.BatchRequest) -> protocol.Batch | None:
        """The reply to ``msg`` now, or None: it is held (a repeat replaces the held one)."""
        key = (ident, msg.rank, msg.step)
        reply, final = self._serve(msg)
        if final:
            self._held.pop(key, None)
            return reply
        now = self._clock()
        self._held[key] = (msg, now, now)
        return None

    def retry(self, changed: bool) -> list[tuple[bytes, protocol.Batch]]:
        """Replies to the held requests that are ready now or were held HOLD_S. ``changed``:
        a message since the last call may have made a step ready (try at once)."""
        now = self._clock()
        out = []
        for key, (msg, since, tried) in list(self._held.items()):
            if not changed and now - tried < RETRY_HELD_S:
                continue
            self._held[key] = (msg, since, now)
            reply, final = self._serve(msg)
            if final or now - since >= HOLD_S:
                del self._held[key]
                if not final:
                    reply.wait_s = 0.0  # held long enough already: ask again at once
                out.append((key[0], reply))
        return out
