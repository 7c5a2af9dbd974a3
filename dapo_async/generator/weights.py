"""How a generator takes new weights: a receiver that survives the learner restarting.

``ReconnectingReceiver.poll`` is called by the generator loop between engine calls:

    connected ── poll() ─► receiver.poll() ─► new (state, v) → engine.update_weights(state, v)
        │                        │ raises (learner gone, transfer failed)
        │                        ▼
        │              close, keep the current weights, log ─► broken
        ▼
    broken ── poll() every RECONNECT_S ─► connect(RECONNECT_TIMEOUT_S) ─► connected

A failed or unreachable weight sync never stops generation. With vLLM and ``weight_sync.mode=dist``
the engine's workers are the group members (``Engine.worker_receiver``, the path in
``engines/vllm_weights.py``): they receive straight into the engine, and ``poll`` returns None.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from dapo_async.weight_sync.base import WeightReceiver

# After a weight-sync failure, try to reconnect this often, each try bounded (Ctrl-C stays quick).
RECONNECT_S = 5.0
RECONNECT_TIMEOUT_S = 2.0
# At start the learner may still be loading: wait this long for its weight-sync endpoint.
CONNECT_TIMEOUT_S = 30.0


class ReconnectingReceiver:
    """Applies new weights to ``engine``; reconnects through ``connect(timeout_s)`` after a
    failure (see the module docstring)."""

    def __init__(self, connect: Callable[[float], WeightReceiver], engine, log):
        self.connect = connect
        self.engine = engine
        self.log = log
        self.receiver: WeightReceiver | None = connect(CONNECT_TIMEOUT_S)
        self.broken_since = 0.0
        self.bytes = 0  # weights received so far (resources/wsync_mb)

    def poll(self) -> None:
        now = time.monotonic()
        if self.receiver is None and not self._reconnect(now):
            return
        try:
            got = self.receiver.poll()
        except Exception as e:
            first_line = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
            self.log.warning(
                "weight sync failed (%s); keeping v%d", first_line, self.engine.version
            )
            self.close()
            self.broken_since = now
            return
        if got is not None:
            state, version = got
            self.engine.update_weights(state, version)
            self.bytes += sum(
                t.numel() * t.element_size() for t in state.values() if hasattr(t, "element_size")
            )
            self.log.debug("weights v%d applied", version)

    def _reconnect(self, now: float) -> bool:
        if now - self.broken_since < RECONNECT_S:
            return False
        try:
            self.receiver = self.connect(RECONNECT_TIMEOUT_S)
        except Exception as e:
            self.broken_since = now
            self.log.debug("weight sync still unreachable: %s", e)
            return False
        self.log.info("weight sync reconnected")
        return True

    def close(self) -> None:
        if self.receiver is not None:
            self.receiver.close()
            self.receiver = None
