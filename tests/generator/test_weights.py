"""ReconnectingReceiver: a failed weight sync keeps the weights and reconnects later; new
weights reach the engine. Hand-written fakes for the receiver and the engine."""

import logging

import pytest

from dapo_async.generator import weights as W
from dapo_async.weight_sync.base import WeightReceiver, WeightSyncError


class FakeEngine:
    def __init__(self):
        self.version = 0
        self.updates = []

    def update_weights(self, state, version):
        self.updates.append((state, version))
        self.version = version


class ScriptedReceiver(WeightReceiver):
    """Returns the scripted results of poll() in order (an exception is raised)."""

    def __init__(self, script):
        self.script = list(script)
        self.closed = False

    def poll(self):
        item = self.script.pop(0) if self.script else None
        if isinstance(item, Exception):
            raise item
        return item

    def close(self):
        self.closed = True


def test_failure_keeps_weights_then_reconnects_after_the_backoff(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(W.time, "monotonic", lambda: clock[0])
    first = ScriptedReceiver([({"w": 1}, 1), WeightSyncError("digest mismatch")])
    second = ScriptedReceiver([({"w": 2}, 2)])
    made = [first]
    connects = []

    def connect(timeout_s):
        connects.append(timeout_s)
        if len(connects) == 1:
            return made[0]
        if len(connects) == 2:
            raise ConnectionError("learner restarting")
        return second

    engine = FakeEngine()
    rr = W.ReconnectingReceiver(connect, engine, logging.getLogger("test"))
    assert connects == [W.CONNECT_TIMEOUT_S]
    rr.poll()
    assert engine.updates == [({"w": 1}, 1)]
    rr.poll()  # the transfer fails: weights kept, receiver closed
    assert first.closed and rr.receiver is None and engine.version == 1
    rr.poll()  # within the back-off: no reconnect yet
    assert len(connects) == 1
    clock[0] += W.RECONNECT_S
    rr.poll()  # the learner is still away
    assert connects[1:] == [W.RECONNECT_TIMEOUT_S] and rr.receiver is None
    clock[0] += W.RECONNECT_S
    rr.poll()  # reconnected, and the new version arrives
    assert engine.updates[-1] == ({"w": 2}, 2)
    rr.close()
    assert second.closed and rr.receiver is None


def test_receiver_interface_is_enforced():
    with pytest.raises(TypeError):
        WeightReceiver()
