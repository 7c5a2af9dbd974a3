"""Held batch requests (buffer/held.py) with a fake ``serve`` and a hand-driven clock."""

from dapo_async import protocol as P
from dapo_async.buffer.held import HOLD_S, RETRY_HELD_S, HeldBatchRequests


class FakeService:
    def __init__(self):
        self.ready: set[int] = set()  # steps that can be served
        self.tries: list[tuple[int, int]] = []  # (step, rank) per serve call
        self.now = 100.0

    def serve(self, msg: P.BatchRequest) -> tuple[P.Batch, bool]:
        self.tries.append((msg.step, msg.rank))
        ok = msg.step in self.ready
        return P.Batch(msg.step, msg.rank, ok, wait_s=0.0 if ok else 0.05), ok


def test_a_ready_step_is_answered_at_once_and_a_held_one_when_it_becomes_ready():
    svc = FakeService()
    held = HeldBatchRequests(svc.serve, clock=lambda: svc.now)
    svc.ready.add(0)
    reply = held.submit(b"a", P.BatchRequest(0, 1, 0))
    assert reply.ready and len(held) == 0
    assert held.submit(b"a", P.BatchRequest(0, 1, 1)) is None and len(held) == 1
    svc.now += RETRY_HELD_S / 2
    assert held.retry(changed=False) == []  # nothing changed, too soon: not even tried
    assert svc.tries == [(0, 0), (1, 0)]
    assert held.retry(changed=True) == [] and svc.tries[-1] == (1, 0)  # tried, not ready
    svc.ready.add(1)
    svc.now += 2 * RETRY_HELD_S  # the clock alone (pacing released by time) retries too
    ((ident, reply),) = held.retry(changed=False)
    assert ident == b"a" and reply.ready and reply.step == 1 and len(held) == 0


def test_a_request_held_too_long_is_told_to_ask_again_at_once():
    svc = FakeService()
    held = HeldBatchRequests(svc.serve, clock=lambda: svc.now)
    assert held.submit(b"r0", P.BatchRequest(0, 2, 3)) is None
    assert held.submit(b"r1", P.BatchRequest(1, 2, 3)) is None
    svc.now += HOLD_S / 2
    assert held.submit(b"r0", P.BatchRequest(0, 2, 3)) is None  # a repeat replaces, restarts
    assert len(held) == 2
    svc.now += HOLD_S / 2
    ((ident, reply),) = held.retry(changed=True)  # r1 held HOLD_S; r0 only half of it
    assert ident == b"r1" and not reply.ready and reply.wait_s == 0.0 and reply.rank == 1
    svc.now += HOLD_S / 2
    ((ident, reply),) = held.retry(changed=False)
    assert ident == b"r0" and reply.wait_s == 0.0 and len(held) == 0
