"""Same-host weight sync through shared memory (``weight_sync/shm.py``), between real processes
and through the real authenticated store: every version arrives bit for bit with its digests
checked, a receiver that starts late gets the newest at once, a copy the learner overwrote is
retried, a corrupted slot is refused with the old weights kept, and nothing stays in /dev/shm."""

import time

import pytest
import torch
from test_weight_sync import SPAWN, _state

from dapo_async.config import load_config
from dapo_async.weight_sync.base import WeightSyncError
from dapo_async.weight_sync.shm import ShmWeightPublisher, ShmWeightReceiver


def _ws(*extra):
    return load_config(None, ["weight_sync.bucket_mb=1", *extra]).weight_sync


def _receive(endpoint, versions, out):
    torch.set_num_threads(1)
    r = ShmWeightReceiver(_ws(), None, "g0", endpoint=endpoint)
    seen, deadline = set(), time.time() + 60
    while len(seen) < len(versions) and time.time() < deadline:
        got = r.poll()
        if got is not None:
            state, v = got
            want = _state(v)
            out.put((v, all(torch.equal(state[k], want[k]) for k in want)))
            seen.add(v)
        time.sleep(0.01)
    r.close()


def test_versions_cross_processes_bit_equal_and_the_files_go_at_close(tmp_path):
    pub = ShmWeightPublisher(_ws(), tmp_path, run_name="t1")
    out = SPAWN.Queue()
    proc = SPAWN.Process(target=_receive, args=(pub.endpoint, [1, 2, 3], out))
    proc.start()
    try:
        for v in (1, 2, 3):
            pub.publish(_state(v), v)
            assert out.get(timeout=60) == (v, True)  # read before the next one is written
    finally:
        proc.join(30)
        files = list(pub.files)
        assert all(f.exists() for f in files)
        pub.close()
    assert not any(f.exists() for f in files)


def test_a_late_receiver_gets_the_newest_version_at_once(tmp_path):
    pub = ShmWeightPublisher(_ws(), tmp_path, run_name="t2")
    try:
        for v in (1, 2, 3, 4):
            pub.publish(_state(v), v)
        r = ShmWeightReceiver(_ws(), tmp_path, "late")
        state, v = r.poll()
        assert v == 4 and all(torch.equal(state[k], _state(4)[k]) for k in state)
        assert r.poll() is None  # nothing newer
        r.close()
    finally:
        pub.close()


def test_a_copy_the_learner_overwrote_is_retried_with_the_newest(tmp_path):
    import json

    pub = ShmWeightPublisher(_ws(), tmp_path, run_name="t3")
    try:
        pub.publish(_state(1), 1)
        r = ShmWeightReceiver(_ws(), tmp_path, "slow")
        old = json.loads(r.store.get("shm/latest"))
        pub.publish(_state(2), 2)
        pub.publish(_state(3), 3)  # rewrites the slot of version 1 while "r" copies it
        assert r._copy(old) is False and r.version == -1
        state, v = r.poll()
        assert v == 3 and all(torch.equal(state[k], _state(3)[k]) for k in state)
        r.close()
    finally:
        pub.close()


def test_a_corrupted_slot_is_refused_and_the_old_weights_kept(tmp_path):
    pub = ShmWeightPublisher(_ws(), tmp_path, run_name="t4")
    try:
        r = ShmWeightReceiver(_ws(), tmp_path, "g")
        pub.publish(_state(1), 1)
        assert r.poll()[1] == 1
        pub.publish(_state(2), 2)
        pub.slots[1][0].view(torch.uint8)[5] ^= 0xFF  # one flipped byte in version 2's slot
        with pytest.raises(WeightSyncError, match="checksum mismatch"):
            r.poll()
        assert r.version == 1
        pub.publish(_state(3), 3)
        assert r.poll()[1] == 3
        r.close()
    finally:
        pub.close()


def test_the_learner_publishes_from_its_device_in_the_wire_dtype(tmp_path):
    """bf16 on the wire (what a GPU learner sends bf16 engines): the receiver gets the cast."""
    from simdevice import sim_device

    pub = ShmWeightPublisher(_ws(), tmp_path, run_name="t5", wire_dtype=torch.bfloat16)
    try:
        with sim_device():
            pub.publish({k: t.to("meta") for k, t in _state(7).items()}, 7)
        r = ShmWeightReceiver(_ws(), tmp_path, "g")
        state, v = r.poll()
        want = _state(7)
        assert v == 7 and state["w"].dtype == torch.bfloat16
        assert torch.equal(state["w"], want["w"].to(torch.bfloat16))
        assert torch.equal(state["n"], want["n"])  # integers keep their dtype
        r.close()
    finally:
        pub.close()


def test_a_slot_handle_opens_the_same_memory_in_either_kind(tmp_path):
    """Host slots: what the learner writes through its tensor the receiver reads through the
    handle. CUDA handles are JSON and give back exactly what ``_share_cuda_`` exported."""
    import json

    from dapo_async.weight_sync.handles import create_slot, decode_cuda, encode_cuda, open_slot

    raw, handle = create_slot("host", tmp_path / "slot", 256)
    other = open_slot(json.loads(json.dumps(handle)))
    raw[:4] = torch.tensor([1, 2, 3, 4], dtype=torch.uint8)
    assert other[:4].tolist() == [1, 2, 3, 4] and other.numel() == 256
    shared = (0, b"\x00ipc\xff" * 16, 4096, 512, b"/torch_123_ref", 8, b"\x01evt" * 8, True)
    h = json.loads(json.dumps(encode_cuda(shared, "GPU-1234", 1000)))
    assert decode_cuda(h) == shared[1:] and h["uuid"] == "GPU-1234" and h["size"] == 1000


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
def test_a_receiver_that_cannot_open_the_learners_gpu_slot_is_told_the_fallback():
    from dapo_async.weight_sync.handles import open_slot

    with pytest.raises(WeightSyncError, match=r"weight_sync\.shm_slots=host"):
        open_slot({"kind": "cuda", "uuid": "GPU-x", "size": 8})


def test_gpu_slots_for_a_cpu_learner_are_refused_naming_the_key():
    from dapo_async.config import ConfigError
    from dapo_async.weight_sync.factory import shm_slots

    cfg = load_config(None, ["weight_sync.mode=shm", "weight_sync.shm_slots=cuda"])
    with pytest.raises(ConfigError, match=r"weight_sync\.shm_slots"):
        shm_slots(cfg, "cpu")
    assert shm_slots(load_config(None, ["weight_sync.mode=shm"]), "cpu") == "host"
