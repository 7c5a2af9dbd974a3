"""The weight-sync checks on GPUs (NCCL) and the vLLM GPU engine; run by tools/gpu_check.sh on
a machine with an NVIDIA GPU (skipped elsewhere)."""

import pytest
import torch
from testutil import last_json, run_cli

from dapo_async.config import load_config


def _two_gpus():
    if torch.cuda.device_count() < 2:
        pytest.skip("NCCL needs each end on its own GPU (two ranks on one device are refused)")


def _nccl_receiver(endpoint, out):
    from dapo_async.weight_sync.dist_receiver import DistWeightReceiver

    torch.cuda.set_device(1)
    r = DistWeightReceiver(
        load_config(None, ["weight_sync.timeout_s=60"]).weight_sync,
        None,
        "gpu",
        endpoint=endpoint,
        backend="nccl",
    )
    import time

    seen = 0
    deadline = time.time() + 300
    while seen < 5 and time.time() < deadline:
        got = r.poll()
        if got is not None:
            state, v = got
            out.put(
                (v, {k: float(t.double().sum()) for k, t in state.items()}, state["w"].device.type)
            )
            seen += 1
    r.close()


@pytest.mark.gpu
def test_nccl_five_versions_bit_equal():
    import multiprocessing as mp

    from dapo_async.weight_sync.dist import DistWeightPublisher

    _two_gpus()
    torch.cuda.set_device(0)
    pub = DistWeightPublisher(
        load_config(None, ["weight_sync.timeout_s=60", "weight_sync.bucket_mb=1"]).weight_sync,
        None,
        host="127.0.0.1",
        backend="nccl",
    )
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_nccl_receiver, args=(pub.endpoint, q))
    p.start()
    try:
        while int(pub.store.get("joins")) < 1:
            assert p.is_alive()
        states = {}
        for v in range(1, 6):
            g = torch.Generator().manual_seed(v)
            states[v] = {
                "w": torch.randn(512, 300, generator=g).cuda(),
                "b": torch.randn(7, generator=g).cuda(),
            }
            pub.publish(states[v], v)
            assert pub.wait_sent(v, 120)
        got = [q.get(timeout=120) for _ in range(5)]
        p.join(60)
    finally:
        if p.is_alive():
            p.kill()
        pub.close()
    for v, sums, device in got:
        assert device == "cuda"
        assert sums == {k: float(t.double().sum()) for k, t in states[v].items()}


@pytest.mark.gpu
def test_shared_gpu_falls_back_to_gloo_through_pinned_host_buffers():
    """One GPU: the learner's CUDA weights go out over gloo (copied asynchronously into pinned
    host buckets; the sender waits for the copy's event) and arrive equal."""
    import threading
    import time

    from dapo_async.weight_sync.dist import DistWeightPublisher
    from dapo_async.weight_sync.dist_receiver import DistWeightReceiver

    ws = load_config(None, ["weight_sync.timeout_s=60", "weight_sync.bucket_mb=1"]).weight_sync
    pub = DistWeightPublisher(ws, None, host="127.0.0.1", backend="gloo")
    rec = DistWeightReceiver(ws, None, "shared", endpoint=pub.endpoint, backend="gloo")
    got = []

    def receive():
        end = time.monotonic() + 120
        while not got and time.monotonic() < end:
            r = rec.poll()
            if r is not None:
                got.append({k: v.clone() for k, v in r[0].items()})

    t = threading.Thread(target=receive)
    t.start()
    try:
        time.sleep(0.5)
        state = {"w": torch.randn(2048, 1024, device="cuda"), "b": torch.randn(7, device="cuda")}
        pub.publish(state, 1)
        assert pub.wait_sent(1, 120)
        t.join(120)
    finally:
        rec.close()
        pub.close()
    assert all(b.is_pinned() for b in pub.buckets.buffers)
    assert all(torch.equal(got[0][k], v.cpu()) for k, v in state.items())


@pytest.mark.gpu
def test_bench_weights_nccl_json(cli_env, repo):
    _two_gpus()
    out = run_cli(repo, cli_env, "bench", "weights", "--backend", "nccl", "--rounds", "2", "--json")
    assert out.returncode == 0, out.stderr[-3000:]
    res = last_json(out)
    assert res["backend"] == "nccl" and res["ratio_500mb"] > 0


def _ipc_receiver(endpoint, versions, out):
    from dapo_async.weight_sync.shm import ShmWeightReceiver

    r = ShmWeightReceiver(
        load_config(None, ["weight_sync.bucket_mb=1"]).weight_sync, None, "ipc", endpoint=endpoint
    )
    import time

    seen, deadline = 0, time.time() + 120
    while seen < versions and time.time() < deadline:
        got = r.poll()
        if got is not None:
            state, v = got
            sums = {k: float(t.double().sum()) for k, t in state.items()}
            out.put((v, sums, state["w"].device.type))
            seen += 1
        time.sleep(0.01)
    r.close()


@pytest.mark.gpu
def test_shared_gpu_weights_travel_device_to_device_through_cuda_ipc():
    """One GPU, two processes: the learner's slots live on the GPU and the generator opens them
    by CUDA IPC handle; every version arrives on the GPU with its digests checked."""
    import multiprocessing as mp

    from dapo_async.weight_sync.shm import ShmWeightPublisher

    ws = load_config(None, ["weight_sync.bucket_mb=1"]).weight_sync
    pub = ShmWeightPublisher(ws, None, run_name="ipc", slots="cuda", device="cuda:0")
    q = mp.get_context("spawn").Queue()
    p = mp.get_context("spawn").Process(target=_ipc_receiver, args=(pub.endpoint, 3, q))
    p.start()
    got, states = [], {}
    try:
        for v in (1, 2, 3):
            g = torch.Generator().manual_seed(v)
            states[v] = {
                "w": torch.randn(512, 300, generator=g).cuda(),
                "b": torch.randn(7, generator=g).cuda(),
            }
            pub.publish(states[v], v)
            got.append(q.get(timeout=120))  # read before the next one is written
        assert all(raw.device.type == "cuda" for raw in pub.raw)
        p.join(60)
    finally:
        if p.is_alive():
            p.kill()
        pub.close()
    for v, sums, device in got:
        assert device == "cuda"
        assert sums == {k: float(t.double().sum()) for k, t in states[v].items()}
