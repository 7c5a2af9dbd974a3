"""Receiver liveness for the weight-sync group: a thread that refreshes ``alive/<id>`` in the
store every HEARTBEAT_S over its own store connection, whatever the generator is doing (a long
batch, a vLLM step), so the publisher leaves a dead receiver out of the next round within
``dist.ALIVE_TIMEOUT_S`` instead of waiting a collective timeout for it."""

from __future__ import annotations

import threading
import time

from dapo_async.weight_sync.store import RemoteStore

# Refresh period of alive/<id>; dist.ALIVE_TIMEOUT_S allows a few missed beats.
HEARTBEAT_S = 1.0


class Heartbeat:
    def __init__(self, endpoint: str, keys_dir, receiver_id: str, timeout_s: float):
        self.key = f"alive/{receiver_id}"
        self._stop = threading.Event()
        self._store = RemoteStore(endpoint, keys_dir, timeout_s=timeout_s)
        self._thread = threading.Thread(target=self._run, name="wsync-heartbeat", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                self._store.set(self.key, str(time.time()))
            except Exception:  # the publisher is gone: the receiver's poll reports it
                break
        self._store.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=HEARTBEAT_S + 1)
