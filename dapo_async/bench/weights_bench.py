"""`dapo-async bench weights`: learner → generator weight-sync throughput against the flat
ceiling, for models of about 100 MB and 500 MB, measured in one run.

One receiver process (a real ``DistWeightReceiver``; gloo on CPU, NCCL with ``--backend nccl``)
and the publisher in this process:

- ``gb_per_s_bucketed``: model bytes ÷ (the sender's round starts → the receiver's ``poll``
  returned the verified weights): digests, manifest, per-bucket broadcasts, verification on the
  receiver — the transfer path this issue is about;
- ``gb_per_s_publish_to_verified``: the same from the moment ``publish`` is called, so it adds
  the snapshot copy into the staging buckets, which the learner pays in ``publish`` (reported
  by the learner as ``time/weight_sync_s``);
- ``gb_per_s_flat_ceiling``: the same bytes as one pre-allocated flat tensor, one broadcast in a
  plain group between the same two processes, no snapshot and no checksums;
- ``ratio`` = bucketed ÷ ceiling;
- ``gb_per_s_shm``: same-host shared memory (``weight_sync.mode=shm``, what `dapo-async train`
  uses on one host) from ``publish`` to the receiver holding the verified weights: the learner
  packs into a slot and digests it, the receiver copies it out and digests its copy —
  comparable with ``gb_per_s_publish_to_verified`` (``shm_vs_dist``);
- ``gb_per_s_memcpy``: one copy of the same bytes between two flat tensors in one process — what
  a transfer cannot beat (``shm`` makes two copies and two digests).

Each figure is the best of ``--rounds`` repetitions.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

SIZES_MB = (100, 500)
# The synthetic model: square float32 matrices of this side (4 MiB each) plus small vectors.
MATRIX_SIDE = 1024
VECTOR_LEN = 4096
# Waiting for the receiver process to start, register and answer.
RECEIVER_TIMEOUT_S = 300.0
CEILING_PREFIX = "ceiling"


def synthetic_state(size_mb: int, device: str = "cpu") -> dict[str, torch.Tensor]:
    per = MATRIX_SIDE * MATRIX_SIDE * 4 + VECTOR_LEN * 4
    n = max(1, round(size_mb * 1e6 / per))
    g = torch.Generator().manual_seed(size_mb)
    out = {}
    for i in range(n):
        out[f"layers.{i}.weight"] = torch.randn(MATRIX_SIDE, MATRIX_SIDE, generator=g).to(device)
        out[f"layers.{i}.bias"] = torch.randn(VECTOR_LEN, generator=g).to(device)
    return out


# NCCL: the sender on GPU 0, the receiver on GPU 1 (NCCL refuses two ranks on one device).
SENDER_GPU, RECEIVER_GPU = 0, 1


def _receiver(endpoint: str, num_bytes: int, rounds: int, backend: str, q) -> None:
    torch.set_num_threads(1)
    if backend == "nccl":
        torch.cuda.set_device(RECEIVER_GPU)
    from dapo_async.config import load_config
    from dapo_async.weight_sync.dist_receiver import DistWeightReceiver

    cfg = load_config(None, ["weight_sync.timeout_s=120"])
    r = DistWeightReceiver(cfg.weight_sync, None, "bench", endpoint=endpoint, backend=backend)
    seen = 0
    while seen < rounds:
        if r.poll() is not None:
            q.put(("bucketed", time.time()))
            seen += 1
    pg = _ceiling_group(r.store, 1, backend)
    device = "cuda" if backend == "nccl" else "cpu"
    flat = torch.empty(num_bytes // 4, dtype=torch.float32, device=device)
    for _ in range(rounds):
        pg.broadcast(flat, 0).wait()
        if device == "cuda":
            torch.cuda.synchronize()
        q.put(("flat", time.time()))
    pg.shutdown()
    r.close()


def _ceiling_group(store, rank: int, backend: str):
    prefix = dist.PrefixStore(CEILING_PREFIX, store)
    if backend == "nccl":
        from dapo_async.weight_sync.collectives import nccl_options

        return dist.ProcessGroupNCCL(prefix, rank, 2, nccl_options(120))
    return dist.ProcessGroupGloo(prefix, rank, 2, timedelta(seconds=120))


def measure(size_mb: int, rounds: int, bucket_mb: int, backend: str) -> dict[str, float]:
    from dapo_async.config import load_config
    from dapo_async.weight_sync.dist import DistWeightPublisher

    device = "cuda" if backend == "nccl" else "cpu"
    if backend == "nccl":
        if torch.cuda.device_count() < 2:
            raise SystemExit("bench weights --backend nccl needs two GPUs (one per end)")
        torch.cuda.set_device(SENDER_GPU)
    state = synthetic_state(size_mb, device)
    num_bytes = sum(t.numel() * t.element_size() for t in state.values())
    cfg = load_config(None, ["weight_sync.timeout_s=120", f"weight_sync.bucket_mb={bucket_mb}"])
    pub = DistWeightPublisher(cfg.weight_sync, None, host="127.0.0.1", backend=backend)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    proc = ctx.Process(target=_receiver, args=(pub.endpoint, num_bytes, rounds, backend, q))
    proc.start()
    try:
        deadline = time.monotonic() + RECEIVER_TIMEOUT_S
        while int(pub.store.get("joins")) < 1:
            if time.monotonic() > deadline or not proc.is_alive():
                raise RuntimeError("the receiver process did not register")
            time.sleep(0.05)
        bucketed, end_to_end = [], []
        for v in range(1, rounds + 1):
            t0 = time.time()
            pub.publish(state, v)
            kind, t1 = q.get(timeout=RECEIVER_TIMEOUT_S)
            assert kind == "bucketed"
            end_to_end.append(t1 - t0)
            bucketed.append(t1 - pub.round_started_at)
        pg = _ceiling_group(pub.store, 0, backend)
        flat = torch.randn(num_bytes // 4, device=device)
        ceiling = []
        for _ in range(rounds):
            t0 = time.time()
            pg.broadcast(flat, 0).wait()
            kind, t1 = q.get(timeout=RECEIVER_TIMEOUT_S)
            assert kind == "flat"
            ceiling.append(t1 - t0)
        proc.join(60)
        pg.shutdown()
    finally:
        if proc.is_alive():
            proc.kill()
        pub.close()
    gb = num_bytes / 1e9
    b, c = gb / min(bucketed), gb / min(ceiling)
    return {
        "bytes": num_bytes,
        "gb_per_s_bucketed": b,
        "gb_per_s_flat_ceiling": c,
        "ratio": b / c,
        "gb_per_s_publish_to_verified": gb / min(end_to_end),
    }


def _shm_receiver(endpoint: str, rounds: int, q) -> None:
    torch.set_num_threads(1)
    from dapo_async.config import load_config
    from dapo_async.weight_sync.shm import ShmWeightReceiver

    r = ShmWeightReceiver(load_config(None, []).weight_sync, None, "bench", endpoint=endpoint)
    q.put(("ready", time.time()))
    seen = 0
    while seen < rounds:
        if r.poll() is not None:
            q.put(("shm", time.time()))
            seen += 1
        else:
            time.sleep(0.0005)
    r.close()


def measure_shm(size_mb: int, rounds: int, bucket_mb: int) -> dict[str, float]:
    """Shared memory from ``publish`` to verified, and a plain copy of the same bytes."""
    import tempfile
    from pathlib import Path

    from dapo_async.config import load_config
    from dapo_async.weight_sync.shm import ShmWeightPublisher

    state = synthetic_state(size_mb)
    num_bytes = sum(t.numel() * t.element_size() for t in state.values())
    cfg = load_config(None, [f"weight_sync.bucket_mb={bucket_mb}"])
    with tempfile.TemporaryDirectory() as tmp:
        pub = ShmWeightPublisher(cfg.weight_sync, Path(tmp), run_name=f"bench-{size_mb}")
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        proc = ctx.Process(target=_shm_receiver, args=(pub.endpoint, rounds, q))
        proc.start()
        try:
            assert q.get(timeout=RECEIVER_TIMEOUT_S)[0] == "ready"
            times = []
            for v in range(1, rounds + 1):
                t0 = time.time()
                pub.publish(state, v)
                kind, t1 = q.get(timeout=RECEIVER_TIMEOUT_S)
                times.append(t1 - t0)
            proc.join(60)
        finally:
            if proc.is_alive():
                proc.kill()
            pub.close()
    src = torch.randn(num_bytes // 4)
    dst = torch.empty_like(src)
    copies = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        dst.copy_(src)
        copies.append(time.perf_counter() - t0)
    gb = num_bytes / 1e9
    return {"gb_per_s_shm": gb / min(times), "gb_per_s_memcpy": gb / min(copies)}


def main(args: argparse.Namespace) -> int:
    torch.set_num_threads(1)
    out: dict[str, float] = {"backend": args.backend, "bucket_mb": args.bucket_mb}
    for size in SIZES_MB:
        res = measure(size, args.rounds, args.bucket_mb, args.backend)
        res.update(measure_shm(size, args.rounds, args.bucket_mb))
        res["shm_vs_dist"] = res["gb_per_s_shm"] / res["gb_per_s_publish_to_verified"]
        print(
            f"{size} MB model ({res['bytes'] / 1e6:.0f} MB): bucketed "
            f"{res['gb_per_s_bucketed']:.2f} GB/s, flat ceiling "
            f"{res['gb_per_s_flat_ceiling']:.2f} GB/s, ratio {res['ratio']:.3f}; publish to "
            f"verified: {args.backend} {res['gb_per_s_publish_to_verified']:.2f} GB/s, shared "
            f"memory {res['gb_per_s_shm']:.2f} GB/s ({res['shm_vs_dist']:.1f}x), memory copy "
            f"{res['gb_per_s_memcpy']:.2f} GB/s",
            file=sys.stderr,
        )
        for k in (
            "gb_per_s_bucketed",
            "gb_per_s_flat_ceiling",
            "ratio",
            "gb_per_s_publish_to_verified",
            "gb_per_s_shm",
            "gb_per_s_memcpy",
            "shm_vs_dist",
        ):
            out[f"{k}_{size}mb"] = res[k]
    if args.json:
        print(json.dumps(out))
    return 0
