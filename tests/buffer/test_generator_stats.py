"""The buffer's view of its generators, from their heartbeats: how many are live, how far the
oldest weights among them trail the learner, how many groups wait in their outboxes."""

import time

from dapo_async import protocol
from dapo_async.buffer.checks import GroupLimits
from dapo_async.buffer.service import BufferService
from dapo_async.config import BufferConfig
from dapo_async.data.tasks import PromptRecord


def _service() -> BufferService:
    records = [PromptRecord(i, [{"role": "user", "content": str(i)}], "0", "t") for i in range(4)]
    return BufferService(
        BufferConfig(lease_timeout_s=30.0), 0, GroupLimits(50, 8), records, [[1, 2]] * 4, None
    )


def test_heartbeats_give_live_generators_their_lag_and_outboxes():
    svc = _service()
    assert "buffer/generators_live" not in svc.stats()  # none heard from yet
    svc.handle(protocol.BatchRequest(0, 1, 5))  # the learner asks for step 5: version 5
    svc.handle(protocol.Heartbeat("gen-0", 5, 2))
    svc.handle(protocol.Heartbeat("gen-1", 3, 1))
    stats = svc.stats()
    assert stats["buffer/generators_live"] == 2.0
    assert stats["buffer/generator_version_lag_max"] == 2.0  # gen-1 holds version 3
    assert stats["buffer/generator_outbox"] == 3.0
    svc.handle(protocol.Heartbeat("gen-1", 5, 0))  # caught up, outbox drained
    stats = svc.stats()
    assert stats["buffer/generator_version_lag_max"] == 0.0
    assert stats["buffer/generator_outbox"] == 2.0


def test_a_silent_generator_leaves_the_view():
    svc = _service()
    svc.handle(protocol.Heartbeat("gen-0", 0, 4))
    svc.handle(protocol.Heartbeat("gen-1", 0, 1))
    svc.state.heartbeat("gen-0", now=time.monotonic() - 31.0)  # last heard past lease_timeout_s
    stats = svc.generator_stats(time.monotonic())
    assert stats["buffer/generators_live"] == 1.0 and stats["buffer/generator_outbox"] == 1.0
    svc.forget_silent_generators(time.monotonic())
    assert set(svc.generator_views) == {"gen-1"}  # the silent one's view is not kept forever
