"""The weight-sync checks on GPUs (NCCL) and the vLLM GPU engine; run by tools/gpu_check.sh on
a machine with an NVIDIA GPU (skipped elsewhere)."""

import pytest
import torch
from testutil import last_json, run_cli

from dapo_async.config import load_config


def _nccl_receiver(endpoint, out):
    from dapo_async.weight_sync.dist import DistWeightReceiver

    torch.cuda.set_device(0)
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
def test_bench_weights_nccl_json(cli_env, repo):
    out = run_cli(repo, cli_env, "bench", "weights", "--backend", "nccl", "--rounds", "2", "--json")
    assert out.returncode == 0, out.stderr[-3000:]
    res = last_json(out)
    assert res["backend"] == "nccl" and res["ratio_500mb"] > 0
