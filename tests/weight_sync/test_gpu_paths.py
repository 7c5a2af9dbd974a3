"""What the CUDA weight-sync path relies on, proven with gloo on CPU: waits on the host with a
deadline (NCCL's ``work.wait()`` does not block the host), weights cast to the wire dtype, the
round given to tensor-parallel workers read once, digests of bf16 and sliced device buffers, and
a slow generator kept in the group by its heartbeat thread."""

import threading
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from dapo_async.config import load_config
from dapo_async.engines.vllm import VLLMEngine
from dapo_async.utils import free_port
from dapo_async.weight_sync import buckets
from dapo_async.weight_sync.collectives import CollectiveTimeout, close_group, wait_all
from dapo_async.weight_sync.dist import ALIVE_TIMEOUT_S, DistWeightPublisher
from dapo_async.weight_sync.dist_receiver import DistWeightReceiver


def _ws(timeout_s: float = 30.0):
    return load_config(
        None, [f"weight_sync.timeout_s={timeout_s}", "weight_sync.bucket_mb=1"]
    ).weight_sync


def test_host_side_wait_gives_up_at_its_deadline():
    """Rank 1 joins the group but never takes part in the broadcast: the host-side wait raises
    after 1 s, although the group's own timeout is 60 s."""
    port = free_port("127.0.0.1")
    stores = [
        dist.TCPStore("127.0.0.1", port, 2, i == 0, timedelta(seconds=30), wait_for_workers=False)
        for i in range(2)
    ]
    groups = [None, None]

    def build(rank):
        groups[rank] = dist.ProcessGroupGloo(stores[rank], rank, 2, timedelta(seconds=60))

    t = threading.Thread(target=build, args=(1,))
    t.start()
    build(0)
    t.join()
    work = groups[0].broadcast(torch.ones(1000), 0)
    t0 = time.monotonic()
    with pytest.raises(CollectiveTimeout):
        wait_all([work], 1.0)
    assert time.monotonic() - t0 < 10
    for g in groups:
        close_group(g, "gloo")


def _receive(rec: DistWeightReceiver, out: list, num: int, deadline_s: float = 60):
    end = time.monotonic() + deadline_s
    while len(out) < num and time.monotonic() < end:
        got = rec.poll()
        if got is not None:
            out.append((got[1], {k: v.clone() for k, v in got[0].items()}))
        time.sleep(0.02)


def test_weights_travel_in_the_wire_dtype():
    pub = DistWeightPublisher(_ws(), None, host="127.0.0.1", wire_dtype=torch.bfloat16)
    rec = DistWeightReceiver(_ws(), None, "g0", endpoint=pub.endpoint)
    got: list = []
    t = threading.Thread(target=_receive, args=(rec, got, 1))
    t.start()
    try:
        state = {"w": torch.randn(64, 33), "n": torch.arange(7)}
        time.sleep(0.5)  # the receiver's first heartbeat is in
        pub.publish(state, 1)
        assert pub.wait_sent(1, 60)
        t.join(60)
    finally:
        rec.close()
        pub.close()
    ((version, recv),) = got
    assert version == 1
    assert recv["w"].dtype == torch.bfloat16 and torch.equal(recv["w"], state["w"].bfloat16())
    assert recv["n"].dtype == torch.int64 and torch.equal(recv["n"], state["n"])  # not cast
    staged = sorted(str(b.dtype) for b in pub.buckets.buffers)
    assert staged == ["torch.bfloat16", "torch.int64"]  # staged in the wire dtype too


def test_receiver_takes_the_round_it_is_given():
    pub = DistWeightPublisher(_ws(), None, host="127.0.0.1")
    rec = DistWeightReceiver(_ws(), None, "g0", endpoint=pub.endpoint)
    try:
        assert rec.poll(at=(-1, -1)) is None  # nothing announced
        time.sleep(0.5)
        pub.publish({"w": torch.ones(5)}, 1)
        deadline = time.monotonic() + 30
        while rec.latest() == (-1, -1):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        at = rec.latest()
        while not rec.ready(at):  # the group forms in the receiver's own thread
            assert time.monotonic() < deadline
            time.sleep(0.05)
        state, version = rec.poll(at=at)
        assert version == 1 and torch.equal(state["w"], torch.ones(5))
        assert rec.poll(at=at) is None  # already taken
    finally:
        rec.close()
        pub.close()


class _FakeLLM:
    """Records ``collective_rpc`` calls; two tensor-parallel workers, each seeing a different
    newest round (the race a per-worker read would lose)."""

    def __init__(self):
        self.calls = []
        self.latest = [[0, 3], [1, 4]]

    def collective_rpc(self, method, args=()):
        self.calls.append((method, args))
        if method == "dapo_wsync_latest":
            return self.latest
        if method == "dapo_wsync_ready":
            return [True, True]
        if method == "dapo_wsync_poll":
            return [{"version": 7}, {"version": 7}]
        return [None, None]

    def reset_prefix_cache(self, **kw):
        pass

    class llm_engine:  # vLLM's attribute name
        @staticmethod
        def set_weight_version(v):
            pass


def test_engine_reads_the_round_once_and_gives_it_to_every_worker():
    eng = VLLMEngine.__new__(VLLMEngine)
    eng.llm, eng.streaming, eng.reset_running, eng._wsync_last = _FakeLLM(), False, False, (-1, -1)
    assert eng.poll_weight_sync() == {"version": 7}
    polls = [args for m, args in eng.llm.calls if m == "dapo_wsync_poll"]
    reads = [m for m, _ in eng.llm.calls if m == "dapo_wsync_latest"]
    assert len(reads) == 1 and polls == [([0, 3],)]  # one read, one RPC carrying that round
    assert eng.version == 7
    assert eng.poll_weight_sync() is None  # the same round is not taken twice


def test_digests_work_for_bf16_and_sliced_device_buffers():
    w = torch.randn(1000).bfloat16()
    with pytest.raises(TypeError):
        w.numpy()  # what the vLLM worker's digest used to call
    assert buckets.tensor_digest(w) == buckets.tensor_digest(w.clone())
    assert buckets.tensor_digest(w) != buckets.tensor_digest(w + 1)
    buf = torch.randn(10_001)
    whole = buckets.word_digest(buf, slice_words=1 << 30)
    assert buckets.word_digest(buf, slice_words=777) == whole  # slices change nothing


def test_heartbeat_thread_keeps_a_slow_generator_in_the_group():
    """The receiver takes v1, then does not poll for twice the alive timeout (a long generate
    call); v2 is published meanwhile. Its heartbeat thread keeps it a member: no re-form, and it
    gets v2 when it polls again."""
    pub = DistWeightPublisher(_ws(60), None, host="127.0.0.1")
    rec = DistWeightReceiver(_ws(60), None, "slow", endpoint=pub.endpoint)
    try:
        time.sleep(0.5)
        pub.publish({"w": torch.ones(5)}, 1)
        got: list = []
        _receive(rec, got, 1)
        assert got[0][0] == 1
        time.sleep(ALIVE_TIMEOUT_S * 1.6)  # "generating", no poll
        pub.publish({"w": torch.full((5,), 2.0)}, 2)
        time.sleep(ALIVE_TIMEOUT_S * 0.6)
        _receive(rec, got, 2)
        assert [v for v, _ in got] == [1, 2]
        assert pub.stats["reforms"] == 1 and pub.errors == 0
    finally:
        rec.close()
        pub.close()
