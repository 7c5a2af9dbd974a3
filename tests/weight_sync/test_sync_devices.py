"""Weight sync with the learner's weights on a simulated accelerator (tests/simdevice.py:
``meta`` computes like the CPU and fails like CUDA): a real gloo round packs them from the
device into its host buckets; device-resident buckets (the NCCL layout) pack, digest on the
device and arrive bit for bit."""

import torch
from simdevice import real, sim_device
from test_weight_sync import SPAWN, _publisher, _receiver, _state, _wait_joined

from dapo_async.weight_sync.buckets import FlatBuckets, digest, word_digest


def test_a_gloo_round_sends_weights_that_live_on_the_device():
    pub = _publisher()
    out = SPAWN.Queue()
    proc = SPAWN.Process(target=_receiver, args=(pub.endpoint, "g0", 2, out, 10))
    proc.start()
    try:
        _wait_joined(pub, 1)
        for v in (1, 2):
            with sim_device():
                on_device = {k: t.to("meta") for k, t in _state(v).items()}
                pub.publish(on_device, v)  # packed into host buckets from the device
            assert pub.wait_sent(v, 60)
        results = sorted(out.get(timeout=60) for _ in range(2))
    finally:
        proc.join(30)
        pub.close()
    assert results == [("g0", 1, True), ("g0", 2, True)]


def test_device_buckets_pack_digest_and_load_like_host_ones():
    state = _state(5)
    shapes = [(k, t.shape, t.dtype) for k, t in state.items()]
    host = FlatBuckets(shapes, 1 << 10, "cpu", wire_dtype=torch.bfloat16)
    host.pack(state)
    with sim_device():
        dev = FlatBuckets(shapes, 1 << 10, "meta", wire_dtype=torch.bfloat16)
        dev.pack_items((k, t.to("meta")) for k, t in state.items())
        digests = [digest(b) for b in dev.buffers]  # on the device: the word digest
        recv = FlatBuckets.from_manifest(dev.manifest(5), "meta")
        for dst, src in zip(recv.buffers, dev.buffers):
            dst.copy_(src)  # what the broadcast does between two GPUs
        got = {k: real(v).clone() for k, v in recv.views().items()}
    assert digests == [word_digest(b) for b in host.buffers]
    for k, want in host.views().items():
        assert torch.equal(got[k], want), k
