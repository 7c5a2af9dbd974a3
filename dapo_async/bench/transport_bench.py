"""`dapo-async bench transport`: the protocol path against a raw ZeroMQ ceiling.

Two processes on tcp://127.0.0.1 (PUSH → PULL). For each case the sender streams for a fixed
time and the receiver counts:

- raw: one pre-built frame per message carrying exactly the bytes the protocol message carries
  (the ceiling: no encoding, no decoding);
- protocol: ``protocol.encode`` of real ``Group`` objects (concatenation included) on the sender,
  ``protocol.decode`` with full validation on the receiver.

Cases: single groups (one group per message) and batched groups (``--batch`` per message).
Ratios are protocol ÷ raw measured in the same run. Prints a table to stderr and, with --json,
one JSON line on stdout.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import time

import numpy as np
import zmq

from dapo_async import protocol
from dapo_async.transport import bind_server, connect_client

# One group as the bench unit: G responses shaped like the trajectory REFERENCE.md measures
# (256 prompt + 1024 response tokens), about 75 KB per group.
RESPONSES_PER_GROUP = 8
RESPONSE_LEN = 1024
PROMPT_LEN = 256
END = b"END"
NUM_PREBUILT = 8
# Receiver gives up on a case if the sender is silent this long (sender died).
SILENCE_TIMEOUT_MS = 30_000


def make_group(seq: int, rng: np.random.Generator) -> protocol.Group:
    g, t = RESPONSES_PER_GROUP, RESPONSES_PER_GROUP * RESPONSE_LEN
    return protocol.Group(
        generator_id="bench",
        seq=seq,
        prompt_id=seq,
        prompt_tokens=rng.integers(0, 32000, PROMPT_LEN, dtype=np.int32),
        response_lens=np.full(g, RESPONSE_LEN, dtype=np.int32),
        tokens=rng.integers(0, 32000, t, dtype=np.int32),
        logprobs=-rng.random(t, dtype=np.float32),
        versions=np.zeros(t, dtype=np.int32),
        rewards=rng.standard_normal(g).astype(np.float32),
        acc=(rng.random(g) > 0.5).astype(np.float32),
        components=np.zeros((g, 1), dtype=np.float32),
        finish=np.zeros(g, dtype=np.uint8),
    )


def _message(groups: list[protocol.Group]) -> protocol.ScoredGroups:
    return protocol.ScoredGroups(batch=protocol.GroupBatch.from_groups(groups, ["overlong"]))


def _sender(endpoint: str, cases: list[tuple[str, int]], seconds: float) -> None:
    ctx = zmq.Context()
    sock = connect_client(ctx, zmq.PUSH, endpoint)
    rng = np.random.default_rng(0)
    pool = [make_group(i, rng) for i in range(256)]
    for mode, batch in cases:
        # Generators build columnar batches as they score groups; the bench cycles through
        # NUM_PREBUILT distinct ones so encode/decode see different data each message.
        msgs = [
            _message([pool[(k * batch + j) % len(pool)] for j in range(batch)])
            for k in range(NUM_PREBUILT)
        ]
        raw = b"".join(bytes(memoryview(f)) for f in protocol.encode(msgs[0]))
        deadline = time.perf_counter() + seconds
        i = 0
        while time.perf_counter() < deadline:
            for _ in range(64):
                if mode == "raw":
                    sock.send(raw, copy=False)
                else:
                    sock.send_multipart(protocol.encode(msgs[i % NUM_PREBUILT]), copy=False)
                i += 1
        sock.send(END)
    sock.close(linger=5000)
    ctx.term()


def _receive(sock: zmq.Socket, mode: str) -> tuple[int, int, int, float]:
    """(messages, groups, bytes, seconds) until END."""
    n_msgs = n_groups = n_bytes = 0
    t0 = None
    while True:
        if not sock.poll(SILENCE_TIMEOUT_MS):
            raise RuntimeError("bench sender went silent")
        frames = sock.recv_multipart(copy=False)
        if len(frames) == 1 and frames[0].bytes == END:
            break
        if t0 is None:
            t0 = time.perf_counter()
            continue  # time from the first message on; do not count it
        n_msgs += 1
        n_bytes += sum(len(f) for f in frames)
        if mode == "protocol":
            n_groups += len(protocol.decode(frames).batch)  # type: ignore[attr-defined]
    return n_msgs, n_groups, n_bytes, time.perf_counter() - (t0 or time.perf_counter())


# Seconds per measurement.
DEFAULT_SECONDS = 2.0


def run(seconds: float = DEFAULT_SECONDS, batch: int = 32) -> dict[str, float]:
    cases = [("raw", 1), ("protocol", 1), ("raw", batch), ("protocol", batch)]
    ctx = zmq.Context()
    server = bind_server(ctx, zmq.PULL, "127.0.0.1", 0)
    proc = mp.get_context("spawn").Process(target=_sender, args=(server.endpoint, cases, seconds))
    proc.start()
    results: dict[tuple[str, int], dict[str, float]] = {}
    try:
        for mode, b in cases:
            msgs, _, nbytes, dt = _receive(server.socket, mode)
            groups = msgs * b
            results[(mode, b)] = {
                "msgs_per_s": msgs / dt,
                "groups_per_s": groups / dt,
                "traj_per_s": groups * RESPONSES_PER_GROUP / dt,
                "mb_per_s": nbytes / dt / 1e6,
            }
    finally:
        proc.join(timeout=30)
        if proc.is_alive():
            proc.kill()
        server.close()
        ctx.term()
    single_p, single_r = results[("protocol", 1)], results[("raw", 1)]
    batch_p, batch_r = results[("protocol", batch)], results[("raw", batch)]
    return {
        "group_bytes": len(
            b"".join(
                bytes(memoryview(f))
                for f in protocol.encode(_message([make_group(0, np.random.default_rng(0))]))
            )
        ),
        "responses_per_group": RESPONSES_PER_GROUP,
        "batch_groups": batch,
        "traj_per_s_single": single_p["traj_per_s"],
        "traj_per_s_single_raw": single_r["traj_per_s"],
        "traj_per_s_batched": batch_p["traj_per_s"],
        "traj_per_s_batched_raw": batch_r["traj_per_s"],
        "mb_per_s_single": single_p["mb_per_s"],
        "mb_per_s_single_raw": single_r["mb_per_s"],
        "mb_per_s_batched": batch_p["mb_per_s"],
        "mb_per_s_batched_raw": batch_r["mb_per_s"],
        "ratio_single": single_p["mb_per_s"] / single_r["mb_per_s"],
        "ratio_batched": batch_p["mb_per_s"] / batch_r["mb_per_s"],
    }


def main(args: argparse.Namespace) -> int:
    res = run(seconds=args.seconds or DEFAULT_SECONDS, batch=args.batch)
    err = sys.stderr
    print(
        f"transport bench: group = {res['responses_per_group']} responses, {res['group_bytes']} bytes; "
        f"batched = {res['batch_groups']} groups/message",
        file=err,
    )
    print(f"{'case':<10}{'path':<10}{'traj/s':>12}{'MB/s':>10}", file=err)
    for case in ("single", "batched"):
        for path, sfx in (("raw", "_raw"), ("protocol", "")):
            print(
                f"{case:<10}{path:<10}{res[f'traj_per_s_{case}{sfx}']:>12.0f}{res[f'mb_per_s_{case}{sfx}']:>10.1f}",
                file=err,
            )
    print(
        f"ratio_single={res['ratio_single']:.3f} ratio_batched={res['ratio_batched']:.3f}", file=err
    )
    if args.json:
        print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in res.items()}))
    return 0
