"""`dapo-async bench soak --minutes M --json`: one real buffer process (WAL on, CurveZMQ keys) under
load for M minutes, with 16 fake generators, 2 learner ranks and 3 hostile peers, each a thread
with its own authenticated connection (``soak_peers.py``), as fast as the buffer serves them.
The hostile peers hoard leases: the watchdog (``buffer.stall_reissue_s``, 3 s here: the fakes
answer in milliseconds) takes them back once, then each holds one lease and no step waits on
it (probation, ``buffer/state.py``).

    start the buffer ─► peers connect ─► every SAMPLE_S: buffer RSS, WAL bytes
    after M minutes: stop the peers, SIGINT the buffer (it writes buffer_final.json)

Reports (one JSON object):
- ``groups_per_s`` stored, ``ack_latency_ms`` p50 / p99 (first send → ack);
- the books: ``acked_stored`` = the buffer's ``produced``, and ``produced`` = trained + dropped
  (by reason) + ready + served but unconfirmed, exactly (``books_balance``);
- ``trained_twice``: group ids in more than one step's shards (must be 0);
- ``rss_mb_per_min`` / ``wal_mb_per_min``: least-squares slopes after the first WARMUP of the
  run (flat: memory and the log do not grow with time), with the first and last samples;
- ``hostile_refused``: the buffer's malformed and rejected counts the hostile peers caused.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import yaml
import zmq

from dapo_async.bench.common import print_result
from dapo_async.bench.soak_peers import FakeGenerator, FakeLearner, HostilePeer

NUM_GENERATORS = 16
NUM_HOSTILE = 3
WORLD = 2
RESPONSES = 4
# Buffer RSS and WAL size are sampled this often.
SAMPLE_S = 1.0
# Slopes are fitted after this fraction of the run (start-up, first compaction).
WARMUP = 0.2
# The soak's lease deadline and watchdog (buffer.lease_deadline_s, buffer.stall_reissue_s).
LEASE_DEADLINE_S = 30.0
STALL_REISSUE_S = 3.0
# How long the buffer may take to start, and to stop after SIGINT.
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0


def write_config(root: Path) -> tuple[Path, Path]:
    from dapo_async.tiny.tokenizer import build_tokenizer

    tok = root / "tokenizer"
    build_tokenizer(tok)
    run = root / "run"
    cfg = {
        "name": "soak",
        "run_dir": str(run),
        "model": {"path": str(tok)},
        "data": {"source": "tiny:arith", "num_train": 4096, "difficulty": 2},
        "generator": {"responses_per_prompt": RESPONSES, "max_tokens": 32},
        # the fakes answer a lease in milliseconds: deadlines scaled to that (the defaults,
        # 900 s and 120 s, are for real generations), so hoarders are caught within the run
        "buffer": {
            "groups_per_step": 16,
            "max_staleness": 1,
            "wal": True,
            "lease_deadline_s": LEASE_DEADLINE_S,
            "stall_reissue_s": STALL_REISSUE_S,
        },
        "tracking": {"aim": False},
    }
    path = root / "soak.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path, run


def start_buffer(cfg_path: Path, run: Path) -> tuple[subprocess.Popen, str]:
    log = open(cfg_path.parent / "buffer.log", "ab")
    proc = subprocess.Popen(
        [sys.executable, "-m", "dapo_async.cli", "buffer", str(cfg_path)],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    endpoint = run / "endpoints" / "buffer"
    deadline = time.monotonic() + START_TIMEOUT_S
    while not endpoint.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"the buffer did not start: see {cfg_path.parent / 'buffer.log'}")
        time.sleep(0.05)
    return proc, endpoint.read_text().strip()


def slope_per_min(samples: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, MB) samples, in MB per minute."""
    if len(samples) < 3:
        return 0.0
    t, y = np.array(samples).T
    return float(np.polyfit(t, y, 1)[0] * 60)


def sample(proc, wal: Path, t0: float, stop: threading.Event, out: list) -> None:
    ps = psutil.Process(proc.pid)
    while not stop.wait(SAMPLE_S):
        wal_mb = wal.stat().st_size / 2**20 if wal.exists() else 0.0
        out.append((time.monotonic() - t0, ps.memory_info().rss / 2**20, wal_mb))


def books(run: Path, gens, learners) -> dict:
    final = json.loads((run / "buffer_final.json").read_text())
    c = final["counters"]
    stored = sum(len(g.stored) for g in gens)
    ids = [i for lr in learners for shard in lr.trained.values() for i in shard]
    dropped = sum(c["dropped"].values())
    held = final["ready"] + final["untrained_assigned"]
    return {
        "acked_stored": stored,
        "produced": c["produced"],
        "trained": c["trained"],
        "dropped": c["dropped"],
        "held": held,
        "books_balance": stored == c["produced"] == c["trained"] + dropped + held,
        # groups still unacknowledged after the generators' drain (the buffer may hold them)
        "unacked_at_stop": sum(len(g.outbox) for g in gens),
        "trained_twice": len(ids) - len(set(ids)),
        "steps": min((len(lr.trained) for lr in learners), default=0),
        "hostile_refused": {"malformed": final["malformed"], "rejected": c["rejected"]},
    }


def soak(minutes: float, root: Path) -> dict:
    cfg_path, run = write_config(root)
    proc, endpoint = start_buffer(cfg_path, run)
    ctx, stop, samples = zmq.Context(), threading.Event(), []
    keys = run / "keys"
    gens = [FakeGenerator(ctx, endpoint, keys, f"soak-gen-{i}", RESPONSES, stop, i)
            for i in range(NUM_GENERATORS)]  # fmt: skip
    progress: dict[int, int] = {}
    learners = [FakeLearner(ctx, endpoint, keys, r, WORLD, stop, progress) for r in range(WORLD)]
    hostile = [HostilePeer(ctx, endpoint, keys, f"hostile-{i}", gens[i].id, RESPONSES, stop)
               for i in range(NUM_HOSTILE)]  # fmt: skip
    t0 = time.monotonic()
    sampler = threading.Thread(target=sample, args=(proc, run / "buffer.wal", t0, stop, samples))
    for p in [*gens, *learners, *hostile, sampler]:
        p.start()
    try:
        stop.wait(minutes * 60)
    finally:
        stop.set()
        for p in [*gens, *learners, *hostile, sampler]:
            p.join(10)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=STOP_TIMEOUT_S)
        ctx.term()
    elapsed = time.monotonic() - t0
    errors = [f"{p.name}: {p.error!r}" for p in [*gens, *learners, *hostile] if p.error]
    return report(run, gens, learners, hostile, samples, elapsed, errors)


def report(run, gens, learners, hostile, samples, elapsed, errors) -> dict:
    lat = np.array([x for g in gens for x in g.latencies]) * 1000
    after = [s for s in samples if s[0] >= WARMUP * elapsed]
    out = {
        "minutes": round(elapsed / 60, 2),
        "generators": len(gens),
        "learner_ranks": len(learners),
        "hostile_peers": len(hostile),
        "groups_per_s": round(sum(len(g.stored) for g in gens) / elapsed, 1),
        "ack_latency_ms": {
            "p50": round(float(np.percentile(lat, 50)), 2) if lat.size else None,
            "p99": round(float(np.percentile(lat, 99)), 2) if lat.size else None,
        },
        "ack_statuses": _sum_dicts([g.statuses for g in gens]),
        "hostile_messages_sent": sum(h.sent for h in hostile),
        "rss_mb": [round(samples[0][1], 1), round(samples[-1][1], 1)] if samples else None,
        "rss_mb_per_min": round(slope_per_min([(t, r) for t, r, _ in after]), 3),
        "wal_mb": [round(samples[0][2], 2), round(samples[-1][2], 2)] if samples else None,
        "wal_mb_per_min": round(slope_per_min([(t, w) for t, _, w in after]), 3),
        "peer_errors": errors,
    }
    out.update(books(run, gens, learners))
    return out


def _imbalance(out: dict) -> str:
    """The books' three sides, for a run where they differ."""
    accounted = out["trained"] + sum(out["dropped"].values()) + out["held"]
    return (
        f"DO NOT BALANCE (acked stored {out['acked_stored']}, produced {out['produced']}, "
        f"trained + dropped + held {accounted}, unacked at stop {out['unacked_at_stop']})"
    )


def _sum_dicts(dicts: list[dict]) -> dict:
    out: dict = {}
    for d in dicts:
        for k, v in d.items():
            out[k] = out.get(k, 0) + v
    return out


def main(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="dapo-soak-") as d:
        out = soak(args.minutes, Path(d))
    ok = out["books_balance"] and out["trained_twice"] == 0 and not out["peer_errors"]
    summary = (
        f"soak {out['minutes']} min: {out['groups_per_s']} groups/s stored, ack p50/p99 "
        f"{out['ack_latency_ms']['p50']}/{out['ack_latency_ms']['p99']} ms, books "
        f"{'balance' if out['books_balance'] else _imbalance(out)}, trained twice "
        f"{out['trained_twice']}, RSS {out['rss_mb_per_min']:+.2f} MB/min, WAL "
        f"{out['wal_mb_per_min']:+.2f} MB/min after warm-up"
    )
    print_result(summary, out, args.json)
    return 0 if ok else 1
