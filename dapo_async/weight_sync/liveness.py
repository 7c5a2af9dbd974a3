"""Receiver liveness for the weight-sync group: a thread that refreshes ``alive/<id>`` in the
store every HEARTBEAT_S over its own store connection, whatever the generator is doing (a long
batch, a vLLM step), so the publisher leaves a dead receiver out of the next round within
``dist.ALIVE_TIMEOUT_S`` instead of waiting a collective timeout for it."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import torch.distributed as dist

# Refresh period of alive/<id>; dist.ALIVE_TIMEOUT_S allows a few missed beats.
HEARTBEAT_S = 1.0


class Heartbeat:
    def __init__(self, host: str, port: int, receiver_id: str, timeout_s: float):
        self.key = f"alive/{receiver_id}"
        self._stop = threading.Event()
        self._store = dist.TCPStore(
            host, port, is_master=False, timeout=timedelta(seconds=timeout_s)
        )
        threading.Thread(target=self._run, name="wsync-heartbeat", daemon=True).start()

    def _run(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                self._store.set(self.key, str(time.time()))
            except Exception:  # the publisher is gone: the receiver's poll reports it
                return

    def close(self) -> None:
        self._stop.set()
