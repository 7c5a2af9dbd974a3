"""A learner waiting for a step says why: a warning with the buffer's counters every
STALL_WARN_S, naming dynamic sampling when it discards almost every group."""

import logging
import threading

import zmq

from dapo_async import protocol as P
from dapo_async import transport as T
from dapo_async.learner import fetch as L


class NeverReadyBuffer(threading.Thread):
    def __init__(self, ctx, stats):
        super().__init__(daemon=True)
        self.server = T.bind_server(ctx, zmq.ROUTER, "127.0.0.1", 0)
        self.stats = stats
        self.done = False

    def run(self):
        while not self.done:
            try:
                ident, msg = T.recv_routed(self.server.socket, timeout_s=0.05)
            except T.RecvTimeout:
                continue
            if isinstance(msg, P.BatchRequest):
                reply = P.Batch(msg.step, msg.rank, False, wait_s=0.02, stats=self.stats)
                T.send_routed(self.server.socket, ident, reply)
        self.server.close()


class StopAfter:
    def __init__(self, n):
        self.n = n

    def __bool__(self):
        self.n -= 1
        return self.n < 0


def test_starving_learner_warns_with_the_reason(monkeypatch, caplog):
    monkeypatch.setattr(L, "STALL_WARN_S", 0.2)
    stats = {"buffer/produced": 100.0, "buffer/dropped_filtered": 95.0, "buffer/ready": 3.0}
    ctx = zmq.Context()
    buf = NeverReadyBuffer(ctx, stats)
    buf.start()
    sock = T.connect_client(ctx, zmq.DEALER, buf.server.endpoint)
    log = logging.getLogger("test-stall")
    try:
        with caplog.at_level(logging.WARNING, logger="test-stall"):
            assert L.fetch_batch(sock, 7, 0, 1, StopAfter(300), log) is None
    finally:
        buf.done = True
        buf.join(5)
        sock.close(linger=0)
        ctx.term()
    warnings = [r.getMessage() for r in caplog.records]
    assert warnings, "no stall warning"
    assert "step 7 has waited" in warnings[0]
    assert "95 dropped by dynamic sampling" in warnings[-1] and "collapsed" in warnings[-1]


def test_stall_message_without_generators():
    assert "No generator" in L.stall_message(3, 61.0, {})
